"""The perplexity windows and figure of llama.cpp's ``llama-perplexity`` tool."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bmoe.domain.perplexity import PplAccumulator, plan_windows
from bmoe.errors import ConfigError


def test_whole_windows_only_and_the_second_half_is_scored() -> None:
    windows = plan_windows(n_tokens=1000, n_ctx=256)
    assert [(w.index, w.start) for w in windows] == [(0, 0), (1, 256), (2, 512)]  # 3 whole windows
    assert (windows[0].first, windows[0].n_scored) == (128, 127)


def test_fewer_than_two_windows_of_text_is_refused_as_the_tool_does() -> None:
    with pytest.raises(ConfigError, match="needs at least 512 tokens; the text tokenizes to only 511"):
        plan_windows(n_tokens=511, n_ctx=256)


def test_the_figure_and_its_error_are_the_tools_formulas() -> None:
    rng = np.random.default_rng(0)
    logps = -rng.exponential(2.0, size=500)
    acc = PplAccumulator()
    acc.add(logps[:200])
    acc.add(logps[200:])
    nll = -logps
    assert acc.count == 500
    assert acc.ppl == pytest.approx(math.exp(nll.mean()), rel=1e-12)
    var = (nll**2).mean() - nll.mean() ** 2
    assert acc.error == pytest.approx(math.exp(nll.mean()) * math.sqrt(var / 499), rel=1e-9)
