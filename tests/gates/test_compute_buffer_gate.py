"""llama.cpp's compute buffer is found for every fixture's context, grows with the ubatch,
and ``--cache-mb auto`` subtracts exactly that figure (and the ``mode:`` line says so)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.cli import main
from bmoe.domain.streaming import MIB, StreamConfig
from bmoe.domain.streaming.prefill_memory import decode_compute_bytes
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]


def test_the_compute_buffer_is_found_positive_and_grows_with_the_ubatch(
    fixture_name: str, tiny_model_path: TinyModel
) -> None:
    model = LlamaModel(tiny_model_path(fixture_name))
    try:
        sizes = {}
        for b in (64, 512):
            with LlamaContext(model, ContextParams(n_ctx=512, n_batch=b, n_ubatch=b)) as ctx:
                assert "CPU" in ctx.compute_buffers, ctx.compute_buffers
                sizes[b] = ctx.compute_buffer_bytes
    finally:
        model.close()
    assert 0 < sizes[64] < sizes[512]


@pytest.mark.parametrize("cache_mb", [None, 64], ids=["auto", "set"])
@pytest.mark.parametrize("ubatch", [64, 512])
def test_auto_subtracts_the_compute_buffer_of_the_sessions_context(
    tiny_model_path: TinyModel, cache_mb: int | None, ubatch: int
) -> None:
    """A decode-sized ubatch: the whole buffer; a prompt-sized one given with -b: the part a
    decode step keeps (the cache lends the rest its room while a prompt runs)."""
    stream = StreamConfig(enabled=True, cache_mb=cache_mb)
    context = ContextParams(n_ctx=512, n_batch=ubatch, n_ubatch=ubatch)
    config = SessionConfig(model_path=tiny_model_path("qwen3moe"), context=context, stream=stream)
    with Session.open(config) as s:
        assert s.streaming is not None
        budget = s.streaming.info.budget
        whole = s.ctx.compute_buffer_bytes
        if ubatch == 512:
            assert whole > MIB  # about 2 MiB at -b 512 for this model
        if cache_mb is None:
            kept = decode_compute_bytes(whole / ubatch, ubatch)
            assert budget.auto and budget.compute_buffer_bytes == kept
            assert (kept == whole) == (ubatch == 64)
            assert (s.streaming.prompt_batch is not None) == (ubatch == 512)
        else:
            assert (budget.bytes, budget.compute_buffer_bytes) == (64 * MIB, 0)


def test_the_mode_line_says_the_compute_buffer_auto_subtracted(
    tiny_model_path: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tiny_model_path("qwen3moe"))
    assert main(["-m", path, "-n", "1", "--moe-stream", "-b", "64"]) == 0
    mode = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("mode:"))
    # a one-shot run keeps no prompt state (no --cache-disk): no prompt cache is set aside
    found = re.search(
        r"cache \d+ MiB \(auto = room \d+ - compute buffer ([0-9.]+) - \d+ MiB "
        r"(left to the machine|kept free in the cgroup); ",
        mode,
    )
    assert found is not None, mode
    assert float(found.group(1)) > 0.1
