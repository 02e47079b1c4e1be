"""The busy-machine warning: the rule (cores free by the load average against ``-t``), and
a session that opens on a machine read as busy says so in its notes."""

from __future__ import annotations

import pytest

from bmoe.domain.threads import busy_machine_note


@pytest.mark.parametrize(
    ("threads", "cores", "load", "suggest"),
    [(2, 2, 1.0, 1), (2, 2, 1.9, 1), (8, 8, 3.2, 5), (4, 4, 6.0, 1)],
)
def test_more_threads_than_free_cores_is_a_warning_naming_a_t_to_try(
    threads: int, cores: int, load: float, suggest: int
) -> None:
    note = busy_machine_note(threads, cores, load)
    assert note is not None and note.startswith("threads: warning:") and note.endswith(f"try -t {suggest}")
    assert f"-t {threads} asks for more" in note


@pytest.mark.parametrize(("threads", "cores", "load"), [(2, 2, 0.3), (1, 2, 1.0), (2, 4, 2.4)])
def test_enough_free_cores_is_no_warning(threads: int, cores: int, load: float) -> None:
    assert busy_machine_note(threads, cores, load) is None


def test_a_session_on_a_busy_machine_says_so_unless_silenced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load average only asks for a look; the CPU sample decides: a load that lingers
    from one's own previous run (the machine idle now) is no warning."""
    from bmoe.adapters.llama import ContextParams
    from bmoe.runtime import Session, SessionConfig
    from bmoe.runtime import cpu_choice as session_module
    from bmoe.testing.fixtures import fixture_path

    sampled: list[float] = []
    monkeypatch.setattr(session_module, "machine_load", lambda: (2, 1.5))
    monkeypatch.setattr(session_module, "other_cpu_busy", lambda: sampled.pop(0))
    config = SessionConfig(model_path=fixture_path("qwen3moe"), context=ContextParams(n_threads=2))
    monkeypatch.setenv("BMOE_BUSY_WARNING", "1")
    sampled.append(1.2)  # another job keeps a core busy now
    with Session.open(config) as s:
        assert [n for n in s.notes if n.startswith("threads:")] == [busy_machine_note(2, 2, 1.2)]
    sampled.append(0.05)  # the load average lingers, the CPUs are idle
    with Session.open(config) as s:
        assert not [n for n in s.notes if n.startswith("threads:")]
    monkeypatch.setenv("BMOE_BUSY_WARNING", "0")
    with Session.open(config) as s:
        assert not [n for n in s.notes if n.startswith("threads:")]
    assert not sampled


def test_the_cpu_sample_sees_a_busy_process_and_not_itself() -> None:
    import multiprocessing

    from bmoe.adapters.cpu_topology import other_cpu_busy

    quiet = other_cpu_busy(0.3)
    assert quiet is not None and quiet >= 0.0
    worker = multiprocessing.get_context("spawn").Process(target=_spin, args=(1.5,))
    worker.start()
    try:
        busy = other_cpu_busy(0.5)
    finally:
        worker.join()
    assert busy is not None and busy > 0.5  # one core spinning


def _spin(seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
