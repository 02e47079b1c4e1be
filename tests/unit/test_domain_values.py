"""Value classes validate when built."""

from __future__ import annotations

import attrs
import pytest

from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.summary import generation_line, timing_line
from bmoe.errors import BmoeError, ConfigError


def test_sampling_defaults_to_greedy() -> None:
    assert SamplingParams().greedy
    assert not SamplingParams(temp=0.7).greedy


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temp": -1.0}, "temp must be >= 0"),
        ({"top_k": -2}, "top_k must be >= 0"),
        ({"top_p": 1.5}, r"top_p must be in \[0, 1\]"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
        ({"repeat_penalty": 0.0}, "repeat_penalty must be > 0"),
        ({"penalty_last_n": -2}, "penalty_last_n must be -1"),
    ],
)
def test_sampling_rejects_bad_values(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_a_repeat_penalty_counts_as_a_penalty_unless_its_window_is_empty() -> None:
    assert SamplingParams(repeat_penalty=1.1).penalised
    assert not SamplingParams(repeat_penalty=1.1, penalty_last_n=0).penalised
    assert not SamplingParams(min_p=0.05).penalised


def test_config_errors_are_value_errors_and_bmoe_errors() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, BmoeError)


def test_rates_from_a_result() -> None:
    result = RunResult(
        text="abc", reasoning="", tokens=(5, 6, 7), n_prompt=4, n_past=7, prefill_s=0.5, decode_s=0.2
    )
    assert result.prefill_tps == 8.0
    assert result.decode_s_tok == pytest.approx(0.1)
    assert result.tok_s == pytest.approx(10.0)
    assert timing_line(result, load_s=1.25) == "timing: load 1.25 s, prefill 4 tokens in 0.500 s (8.0 tok/s)"
    assert generation_line(result) == "generation: 3 tokens, 0.1000 s/token (10.0 tok/s)"


def test_generate_request_validates() -> None:
    with pytest.raises(ConfigError, match="empty prompt"):
        GenerateRequest(prompt="")
    with pytest.raises(ConfigError, match="n_predict must be >= 0, not -1"):
        GenerateRequest(prompt="x", n_predict=-1)
    assert GenerateRequest(prompt="x").clear_kv


def test_the_timing_line_says_how_many_times_over_the_prefill_read_the_experts() -> None:
    from bmoe.domain.streaming import MIB, StreamReport
    from bmoe.domain.streaming.counters import StreamCounters

    result = RunResult(
        text="", reasoning="", tokens=(1,), n_prompt=2048, n_past=2049, prefill_s=2.0, decode_s=0.0
    )
    report = StreamReport(
        StreamCounters(bytes_read=3000 * MIB, stall_s=0.5), StreamCounters(), 0, 0.0, 1000 * MIB
    )
    line = timing_line(attrs.evolve(result, stream=report), load_s=1.0)
    assert line.endswith("; prefill read 3000.0 MiB (the experts 3.00 times over), waited 0.500 s for reads")
    unknown = attrs.evolve(report, expert_bytes=0)
    assert "times over" not in timing_line(attrs.evolve(result, stream=unknown), load_s=1.0)
    sized = timing_line(attrs.evolve(result, stream=report), load_s=1.0, n_ubatch=1664)
    assert "(the experts 3.00 times over, ubatch 1664)" in sized
