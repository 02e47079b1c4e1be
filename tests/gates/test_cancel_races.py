"""Cancel races: ``cancel`` at random moments, and the session answers as if nothing happened.

One ``--session`` process runs a chat turn and a decision again and again; a ``cancel`` lands
before the request begins, during its prefill or decode, after it is done, with the
request's id, without one, or with another id. Every request ends with its result or a
cancelled one (never an error), and the request after it gives what a fresh process gives.

``BMOE_CANCEL_RACES`` sets the number of races (default 300).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.protocol import Begin, DecideDone, Done, Error, Response
from bmoe.client import SessionClient

TinyModel = Callable[[str], Path]

Outcome = tuple[object, ...]
RACES = int(os.environ.get("BMOE_CANCEL_RACES", "300"))
ARGS = ["--chatml", "--no-think", "-c", "512", "--decide"]

FIRST = {"cmd": "generate", "prompt": "Hello there", "n_predict": 4}
RACED = {"cmd": "generate", "prompt": "Tell me a long story", "clear_kv": False, "n_predict": 48}
CHECK = {"cmd": "generate", "prompt": "Shorter, please", "clear_kv": False, "n_predict": 6}
DECIDE = {
    "cmd": "decide",
    "prefix": "Task: turn on Wi-Fi. Think of the settings screens you know. ",
    "suffix": "Options: A) Network B) Display. Answer with the letter.",
    "choices": ["A", "B"],
}


def _final(client: SessionClient, rid: object) -> Response:
    responses = list(client.responses_until_final())
    final = responses[-1]
    assert not isinstance(final, Error), final
    assert isinstance(final, Done | DecideDone) and final.id == rid, final
    assert isinstance(responses[0], Begin) and responses[0].id == rid
    return final


def _send(client: SessionClient, *requests: dict[str, object]) -> None:
    client.send_raw(b"".join(json.dumps(r).encode() + b"\n" for r in requests))


def _request(client: SessionClient, request: dict[str, object], rid: object) -> Response:
    _send(client, {**request, "id": rid})
    return _final(client, rid)


def _outcome(final: Response) -> Outcome:
    if isinstance(final, Done):
        return (final.cancelled, final.text, final.tokens, final.n_past)  # the id differs
    assert isinstance(final, DecideDone)
    return (final.cancelled, final.choice_logp, final.n_tokens)


def _references(args: list[str]) -> tuple[dict[bool, Outcome], Outcome, Outcome, float]:
    """What a fresh process answers to CHECK after FIRST, with RACED done between them or
    not; its answers to RACED and DECIDE; and how long RACED takes."""
    checks = {}
    with SessionClient(args) as fresh:
        for raced_done in (False, True):
            _request(fresh, FIRST, "first")
            if raced_done:
                start = time.monotonic()
                raced = _outcome(_request(fresh, RACED, "raced"))
                raced_s = time.monotonic() - start
            checks[raced_done] = _outcome(_request(fresh, CHECK, "check"))
        decided = _outcome(_request(fresh, DECIDE, "decide"))
    return checks, raced, decided, raced_s


MOMENTS = ["queued_same_id", "queued_no_id", "early_unknown_id", "during_id", "during_no_id",
           "during_other_id", "after_id", "after_no_id"]  # fmt: skip


def test_cancels_at_random_moments_leave_the_session_as_a_fresh_one(tiny_model_path: TinyModel) -> None:
    args = ["-m", str(tiny_model_path("qwen3moe")), *ARGS]
    checks, raced, decided, raced_s = _references(args)
    rng = random.Random(13)
    counts = {"cancelled": 0, "finished": 0}
    during_cancelled = 0
    with SessionClient(args, timeout=60) as client:
        for i in range(RACES):
            decide = rng.random() < 0.3
            moment = rng.choice(MOMENTS)
            rid = f"r{i}"
            if not decide:
                _request(client, FIRST, f"f{i}")
            request = {**(DECIDE if decide else RACED), "id": rid}
            cancel_id = {"cmd": "cancel", "id": rid}
            if moment == "queued_same_id":
                _send(client, request, cancel_id)  # queued when the cancel is read, or just begun
            elif moment == "queued_no_id":
                _send(client, request, {"cmd": "cancel"})
            elif moment == "early_unknown_id":
                _send(client, cancel_id, request)  # the id is unknown when the cancel comes
            else:
                _send(client, request)
                if moment.startswith("during"):
                    time.sleep(rng.uniform(0, 1.3 * raced_s))
                    if moment == "during_id":
                        _send(client, cancel_id)
                    elif moment == "during_no_id":
                        _send(client, {"cmd": "cancel"})
                    else:
                        _send(client, {"cmd": "cancel", "id": f"not-{rid}"})
            final = _final(client, rid)
            if moment.startswith("after"):
                _send(client, cancel_id if moment == "after_id" else {"cmd": "cancel"})
            outcome = _outcome(final)
            cancelled = bool(outcome[0])
            counts["cancelled" if cancelled else "finished"] += 1
            during_cancelled += cancelled and moment.startswith("during")
            if moment in ("early_unknown_id", "during_other_id", "after_id", "after_no_id"):
                assert not cancelled, (moment, final)
            if moment == "queued_same_id":
                assert cancelled, (moment, final)
            if decide:
                if not cancelled:
                    assert outcome == decided, (moment, final)
                again = _outcome(_request(client, DECIDE, f"d{i}"))
                assert again == decided, (moment, final)
            else:
                if not cancelled:
                    assert outcome == raced, (moment, final)
                check = _outcome(_request(client, CHECK, f"c{i}"))
                assert check == checks[not cancelled], (moment, final)
        assert client.close() == 0
    print(f"raced {RACES} cancels: {counts}, {during_cancelled} cancelled while running")
    assert counts["cancelled"] > RACES // 10 and counts["finished"] > RACES // 10 and during_cancelled > 0


def test_a_cancel_by_id_reaches_a_queued_request_and_spares_the_one_running(
    tiny_model_path: TinyModel,
) -> None:
    args = ["-m", str(tiny_model_path("qwen3moe")), *ARGS]
    with SessionClient(args, timeout=60) as client:
        _send(
            client,
            {**RACED, "clear_kv": True, "n_predict": 200, "id": "a"},
            {**RACED, "clear_kv": True, "id": "b"},
            {"cmd": "cancel", "id": "b"},
        )
        a = _final(client, "a")
        b = _final(client, "b")
        assert isinstance(a, Done) and not a.cancelled and a.tokens == 200
        assert isinstance(b, Done) and b.cancelled and b.tokens == 0
        # a cancel for a finished id does nothing to the next request with another id
        _send(client, {"cmd": "cancel", "id": "a"}, {**RACED, "clear_kv": True, "id": "c"})
        c = _final(client, "c")
        assert isinstance(c, Done) and not c.cancelled and c.tokens == RACED["n_predict"]


@pytest.mark.parametrize("rid", [0, "x"])
def test_a_cancel_for_an_unknown_id_does_nothing(tiny_model_path: TinyModel, rid: object) -> None:
    args = ["-m", str(tiny_model_path("qwen3moe")), *ARGS]
    with SessionClient(args, timeout=60) as client:
        _send(client, {**RACED, "clear_kv": True, "id": "run"}, {"cmd": "cancel", "id": rid})
        final = _final(client, "run")
        assert isinstance(final, Done) and not final.cancelled
