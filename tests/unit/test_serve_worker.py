"""The server's worker: one job at a time, in order; a cancel reaches only its own job."""

from __future__ import annotations

import threading
from concurrent.futures import wait

import pytest

from bmoe.serve.errors import RequestCancelledError, ServerClosedError
from bmoe.serve.worker import Job, SessionWorker

TIMEOUT = 10.0


class Gate:
    """A job that says it began, then waits to be let go."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.go = threading.Event()

    def __call__(self, job: Job[str]) -> str:
        job.began()
        self.began.set()
        assert self.go.wait(TIMEOUT)
        return "gate"


@pytest.fixture
def cancels() -> list[str]:
    return []


@pytest.fixture
def worker(cancels: list[str]) -> SessionWorker:
    w = SessionWorker(lambda: cancels.append("cancel"))
    yield w  # type: ignore[misc]
    w.close(TIMEOUT)


def test_jobs_run_one_at_a_time_in_the_order_they_came(worker: SessionWorker) -> None:
    gate = Gate()
    order: list[int] = []
    first = worker.submit(gate)
    rest = [worker.submit(lambda job, i=i: order.append(i) or i) for i in range(5)]
    assert gate.began.wait(TIMEOUT)
    assert order == [] and worker.pending == 5  # all wait behind the running one
    gate.go.set()
    wait([j.future for j in rest], TIMEOUT)
    assert first.future.result() == "gate"
    assert [j.future.result() for j in rest] == list(range(5))
    assert order == list(range(5))


def test_a_queued_job_cancelled_never_runs(worker: SessionWorker, cancels: list[str]) -> None:
    gate = Gate()
    worker.submit(gate)
    ran: list[str] = []
    queued = worker.submit(lambda job: ran.append("ran"))
    assert gate.began.wait(TIMEOUT)
    queued.cancel()
    gate.go.set()
    with pytest.raises(RequestCancelledError, match="before it ran"):
        queued.future.result(TIMEOUT)
    assert ran == [] and cancels == []  # nothing in flight was cancelled for it


def test_a_running_job_is_cancelled_in_flight_once_it_began(
    worker: SessionWorker, cancels: list[str]
) -> None:
    started = threading.Event()
    go = threading.Event()

    def work(job: Job[str]) -> str:
        started.set()
        assert go.wait(TIMEOUT)
        assert cancels == []  # a cancel before began() is held back...
        job.began()
        assert cancels == ["cancel"]  # ...and passed on now
        return "done"

    job = worker.submit(work)
    assert started.wait(TIMEOUT)
    job.cancel()
    go.set()
    assert job.future.result(TIMEOUT) == "done"


def test_cancel_after_began_reaches_the_session_once(worker: SessionWorker, cancels: list[str]) -> None:
    gate = Gate()
    job = worker.submit(gate)
    assert gate.began.wait(TIMEOUT)
    job.cancel()
    job.cancel()
    assert cancels == ["cancel"]
    gate.go.set()
    job.future.result(TIMEOUT)


def test_cancel_after_a_job_is_done_does_nothing(worker: SessionWorker, cancels: list[str]) -> None:
    job = worker.submit(lambda job: job.began() or 1)
    assert job.future.result(TIMEOUT) == 1
    job.cancel()
    assert cancels == []


def test_an_error_of_the_work_is_the_jobs_and_the_worker_goes_on(worker: SessionWorker) -> None:
    def boom(job: Job[int]) -> int:
        raise ValueError("boom")

    failed = worker.submit(boom)
    with pytest.raises(ValueError, match="boom"):
        failed.future.result(TIMEOUT)
    assert worker.submit(lambda job: 2).future.result(TIMEOUT) == 2


def test_close_cancels_what_runs_and_what_waits_and_refuses_more(cancels: list[str]) -> None:
    worker = SessionWorker(lambda: cancels.append("cancel"))
    gate = Gate()
    running = worker.submit(gate)
    queued = worker.submit(lambda job: "never")
    assert gate.began.wait(TIMEOUT)
    closer = threading.Thread(target=worker.close, args=(TIMEOUT,))
    closer.start()
    for _ in range(1000):  # until close() cancelled the running job in flight
        if cancels:
            break
        closer.join(0.01)
    assert cancels == ["cancel"]
    gate.go.set()
    closer.join(TIMEOUT)
    assert running.future.result(TIMEOUT) == "gate"
    with pytest.raises(RequestCancelledError):
        queued.future.result(TIMEOUT)
    with pytest.raises(ServerClosedError):
        worker.submit(lambda job: 1)
