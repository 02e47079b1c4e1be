"""The decide probe without a model: the lens math (final norm, head rows, logit transforms,
log-softmax over the choices), the record and its JSON, when the decision policy observes
and writes (over the scripted backend and a fake probe), and the flag."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import pytest

from bmoe import cli
from bmoe.adapters.decide_probe import probe_line
from bmoe.domain.decide import DecideConfig, DecideRequest, DecideResult, LastPrefixCache, log_softmax
from bmoe.domain.decide.probe import OutputHead, ProbeObservation, ProbeRecord, lens, probe_record
from bmoe.errors import ChoiceCollisionError, ConfigError, DecodeError
from bmoe.frontend.configs import decide_config
from bmoe.serve.flags import build_parser as serve_parser
from bmoe.service.decider import run_decide
from bmoe.testing.fake_decide_backend import ScriptedDecideBackend

ON = DecideConfig(enabled=True)
TASK = "Task: turn on Wi-Fi. "
SCREEN = "Screen: Settings. A) Network B) Display."


# -- the lens math --------------------------------------------------------------------------


def test_the_rms_norm_is_llama_cpps() -> None:
    x = np.array([1.0, -2.0, 3.0, 0.5])
    w = np.array([0.5, 1.0, 2.0, -1.0])
    head = OutputHead(norm_weight=w, eps=1e-5)
    expected = x / math.sqrt(float(np.mean(x * x)) + 1e-5) * w
    assert np.allclose(head.normed(x), expected, rtol=1e-15, atol=0)


def test_the_layer_norm_takes_the_mean_out_and_adds_the_bias() -> None:
    x = np.array([1.0, -2.0, 3.0, 0.5])
    w, b = np.array([0.5, 1.0, 2.0, -1.0]), np.array([0.1, 0.2, 0.3, 0.4])
    head = OutputHead(norm_weight=w, eps=1e-5, norm_kind="layer", norm_bias=b)
    c = x - x.mean()
    assert np.allclose(head.normed(x), c / math.sqrt(float(np.mean(c * c)) + 1e-5) * w + b, rtol=1e-15)


def test_the_head_rows_make_the_logits_then_the_scale_then_the_soft_cap() -> None:
    x = np.array([[3.0, 4.0], [1.0, 0.0]])  # two states
    rows = np.array([[10.0, 0.0], [0.0, 10.0], [1.0, 1.0]])  # three tokens
    plain = OutputHead(norm_weight=np.ones(2), eps=0.0)
    normed = plain.normed(x)
    assert np.allclose(plain.logits(x, rows), normed @ rows.T)
    scaled = OutputHead(norm_weight=np.ones(2), eps=0.0, logit_scale=0.5)
    assert np.allclose(scaled.logits(x, rows), 0.5 * (normed @ rows.T))
    capped = OutputHead(norm_weight=np.ones(2), eps=0.0, logit_scale=0.5, softcap=3.0)
    assert np.allclose(capped.logits(x, rows), 3.0 * np.tanh(0.5 * (normed @ rows.T) / 3.0))
    assert plain.logits(x[0], rows).shape == (3,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"norm_weight": np.ones((2, 2)), "eps": 1e-6}, "one non-empty row"),
        ({"norm_weight": np.ones(3), "eps": 1e-6, "norm_bias": np.ones(2)}, "norm_bias"),
        ({"norm_weight": np.ones(3), "eps": -1.0}, "must be >= 0"),
        ({"norm_weight": np.ones(3), "eps": 1e-6, "norm_kind": "group"}, "unknown norm kind"),
    ],
)
def test_an_impossible_head_is_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OutputHead(**kwargs)  # type: ignore[arg-type]


def test_head_rows_of_the_wrong_width_are_refused() -> None:
    with pytest.raises(ValueError, match=r"head rows must be \[n, 3\]"):
        OutputHead(norm_weight=np.ones(3), eps=0.0).logits(np.ones(3), np.ones((2, 4)))


def observation(
    states: Sequence[Sequence[float]],
    rows: Sequence[Sequence[float]],
    *,
    seen: Sequence[bool] | None = None,
    seq: int = 0,
    n_expert: int = 3,
) -> ProbeObservation:
    n_layer = len(states)
    return ProbeObservation(
        seq=seq,
        states=np.asarray(states, dtype=np.float32),
        seen=np.asarray(seen if seen is not None else [True] * n_layer),
        head=OutputHead(norm_weight=np.ones(len(states[0])), eps=0.0),
        rows=np.asarray(rows, dtype=np.float32),
        cnt=np.arange(n_layer * n_expert, dtype=np.int64).reshape(n_layer, n_expert),
        wsum=np.full((n_layer, n_expert), 1.0 / 3.0),
        nu=2,
    )


def test_the_lens_is_the_log_softmax_over_the_choices_of_each_layers_logits() -> None:
    states = [[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]
    rows = [[4.0, 0.0], [0.0, 4.0]]
    got = lens(observation(states, rows))
    head = OutputHead(norm_weight=np.ones(2), eps=0.0)
    for layer, state in enumerate(states):
        expected = log_softmax(head.logits(state, rows))
        assert got[layer] == pytest.approx(tuple(expected), abs=1e-12)
    assert got[0] is not None and got[0][0] > got[0][1]  # layer 0 leans to choice 0
    assert got[1] is not None and got[1][1] > got[1][0]  # layer 1 to choice 1
    assert got[2] is not None and got[2][0] == pytest.approx(got[2][1])  # layer 2 is undecided


def test_a_layer_whose_state_was_not_seen_has_no_lens() -> None:
    got = lens(observation([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], seen=[False, True]))
    assert got[0] is None and got[1] is not None


def test_an_observation_with_mismatched_shapes_is_refused() -> None:
    good = observation([[1.0, 0.0]], [[1.0, 0.0]])
    with pytest.raises(ValueError, match="do not match"):
        ProbeObservation(
            seq=0, states=good.states, seen=np.ones(2, dtype=bool), head=good.head, rows=good.rows,
            cnt=good.cnt, wsum=good.wsum, nu=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="cnt"):
        ProbeObservation(
            seq=0, states=good.states, seen=good.seen, head=good.head, rows=good.rows,
            cnt=good.cnt, wsum=np.zeros((1, 4)), nu=2,
        )  # fmt: skip


# -- the record ------------------------------------------------------------------------------


def result(logp: tuple[float, ...], best: int = 0) -> DecideResult:
    return DecideResult(best=best, choice_logp=logp, n_reused=10, n_prefilled=30, prefill_s=0.25)


def test_the_record_holds_the_decision_the_lens_and_the_routing_in_the_documented_order() -> None:
    obs = observation([[1.0, 0.0], [0.0, 2.0]], [[4.0, 0.0], [0.0, 4.0]], seq=7)
    record = probe_record(obs, ("A", "B"), result((-0.5, -1.5)))
    assert (record.seq, record.n_tokens, record.n_prefilled, record.prefill_s) == (7, 40, 30, 0.25)
    assert (record.choices, record.best, record.logp, record.nu) == (("A", "B"), 0, (-0.5, -1.5), 2)
    assert record.lens == lens(obs)
    assert record.cnt == ((0, 1, 2), (3, 4, 5))
    assert record.wsum == ((0.333333,) * 3,) * 2  # rounded to a millionth
    line = probe_line(record)
    assert line.endswith("\n") and "\n" not in line[:-1]
    decoded = json.loads(line)
    assert list(decoded) == [
        "seq", "n_tokens", "n_prefilled", "prefill_s", "choices", "best", "logp", "lens", "nu", "cnt", "wsum",
    ]  # fmt: skip
    assert decoded["logp"] == [-0.5, -1.5] and decoded["cnt"] == [[0, 1, 2], [3, 4, 5]]


def test_json_has_no_infinity_a_ruled_out_choice_is_null() -> None:
    record = ProbeRecord(
        seq=0, n_tokens=3, n_prefilled=3, prefill_s=0.0, choices=("A", "B"), best=0,
        logp=(-0.1, -math.inf), lens=(None, (0.0, -math.inf)), nu=1, cnt=((1,),), wsum=((1.0,),),
    )  # fmt: skip
    decoded = json.loads(probe_line(record))
    assert decoded["logp"] == [-0.1, None] and decoded["lens"] == [None, [0.0, None]]


def test_a_record_of_other_choices_than_the_observation_is_refused() -> None:
    obs = observation([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="3 choices, 2 head rows"):
        probe_record(obs, ("A", "B", "C"), result((-1.0, -2.0, -3.0)))


# -- when the policy observes and writes ------------------------------------------------------


class FakeProbe:
    """An ``IDecideProbe`` whose observations are fixed; records what it was asked."""

    def __init__(self, n_layer: int = 2, n_embd: int = 4, n_expert: int = 3) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.records: list[ProbeRecord] = []
        self.n_layer, self.n_embd, self.n_expert = n_layer, n_embd, n_expert
        self.seq = 0

    def begin(self) -> None:
        self.calls.append(("begin",))

    def end(self) -> None:
        self.calls.append(("end",))

    def observation(self, choice_tokens: Sequence[int]) -> ProbeObservation:
        self.calls.append(("observation", tuple(choice_tokens)))
        rng = np.random.default_rng(len(self.records))
        obs = ProbeObservation(
            seq=self.seq,
            states=rng.normal(size=(self.n_layer, self.n_embd)).astype(np.float32),
            seen=np.ones(self.n_layer, dtype=bool),
            head=OutputHead(norm_weight=np.ones(self.n_embd), eps=1e-6),
            rows=rng.normal(size=(len(choice_tokens), self.n_embd)).astype(np.float32),
            cnt=np.zeros((self.n_layer, self.n_expert), dtype=np.int64),
            wsum=np.zeros((self.n_layer, self.n_expert)),
            nu=2,
        )
        self.seq += 1
        return obs

    def write(self, record: ProbeRecord) -> None:
        self.calls.append(("write",))
        self.records.append(record)


def test_an_answered_decision_is_observed_around_its_prefills_and_written_once() -> None:
    backend, probe = ScriptedDecideBackend(), FakeProbe()
    cache = LastPrefixCache()
    first = run_decide(backend, cache, DecideRequest(prefix=TASK, suffix=SCREEN, choices="AB"), ON, probe)
    second = run_decide(backend, cache, DecideRequest(prefix=TASK, suffix="?", choices="AB"), ON, probe)
    a, b = backend.tokenize("A", special=False)[0], backend.tokenize("B", special=False)[0]
    assert probe.calls == [("begin",), ("end",), ("observation", (a, b)), ("write",)] * 2
    assert [r.seq for r in probe.records] == [0, 1]
    assert [(r.logp, r.best, r.n_tokens) for r in probe.records] == [
        (first.choice_logp, first.best, first.n_tokens),
        (second.choice_logp, second.best, second.n_tokens),
    ]
    assert second.n_reused > 0 and probe.records[1].n_prefilled == second.n_prefilled


def test_the_probe_does_not_change_the_answer() -> None:
    request = DecideRequest(prefix=TASK, suffix=SCREEN, choices=("A", "B", "C"))
    plain = run_decide(ScriptedDecideBackend(), LastPrefixCache(), request, ON)
    probed = run_decide(ScriptedDecideBackend(), LastPrefixCache(), request, ON, FakeProbe())
    timeless = {"restore_s": 0.0, "store_s": 0.0, "prefill_s": 0.0}
    assert attrs.evolve(probed, **timeless) == attrs.evolve(plain, **timeless)


def test_a_refused_decision_is_not_observed() -> None:
    probe = FakeProbe()
    with pytest.raises(ChoiceCollisionError):
        request = DecideRequest(suffix="x", choices=("Ab", "Ac"))
        run_decide(ScriptedDecideBackend(), LastPrefixCache(), request, ON, probe)
    assert probe.calls == []


def test_a_cancelled_or_failed_decision_stops_observing_and_writes_nothing() -> None:
    request = DecideRequest(prefix=TASK, suffix=SCREEN, choices=("A", "B"))
    probe = FakeProbe()
    backend = ScriptedDecideBackend()
    backend.abort_prefill = 1
    assert run_decide(backend, LastPrefixCache(), request, ON, probe).cancelled
    backend = ScriptedDecideBackend()
    backend.fail_prefill = 2
    with pytest.raises(DecodeError):
        run_decide(backend, LastPrefixCache(), request, ON, probe)
    assert probe.calls == [("begin",), ("end",)] * 2 and probe.records == []


# -- the flag ----------------------------------------------------------------------------------


def test_a_probe_without_decisions_is_refused_at_startup() -> None:
    with pytest.raises(ConfigError, match="--decide-probe needs --decide"):
        DecideConfig(enabled=False, probe=Path("probe.jsonl"))
    assert DecideConfig(enabled=True).probe is None  # off by default


def test_the_flag_reaches_the_session_settings_of_the_cli_and_the_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--decide", "--decide-probe", "/tmp/p.jsonl"]
    args = cli.build_parser().parse_args(["--session", *flags])
    assert decide_config(args) == DecideConfig(enabled=True, probe=Path("/tmp/p.jsonl"))
    assert decide_config(serve_parser().parse_args(flags)) == decide_config(args)
    with pytest.raises(SystemExit) as usage:
        cli.main(["--session", "--decide-probe", "/tmp/p.jsonl"])
    assert usage.value.code == 2 and "--decide-probe needs --decide" in capsys.readouterr().err
