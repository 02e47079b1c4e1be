"""Value classes validate when built."""

from __future__ import annotations

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
    ],
)
def test_sampling_rejects_bad_values(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


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
