"""The lazy load (``bmoe.cext.load_hook``): llama.cpp's model load without its populate.

- the assumption it rests on: libllama calls ``mmap`` and the advice calls through its own
  relocation slots, which the hook finds and redirects;
- a load with ``populate=False`` reads less of the file from the disk than the load llama.cpp
  does on its own (measured in ``/proc/self/io`` after dropping the file from the page cache;
  skipped where the disk's reads cannot be seen, a file system in memory for one);
- a streamed session's whole open (the load, then the capture decode, aborted once its
  scheduler has seen every node) reads less than half the file, where the populate read it
  all;
- the wrappers change nothing while they are off, and a streamed session loaded lazily
  computes the same tokens and logits, bit for bit, as one loaded with the populate.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.adapters.llama.model import LlamaModel, ModelParams
from bmoe.cext import load_hook
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)


def disk_read_bytes() -> int:
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/self/io")


def load_reads(path: Path, populate: bool) -> tuple[int, bool]:
    """Bytes read from the disk while ``path`` loads (dropped from the page cache first),
    and whether the load was lazy."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    before = disk_read_bytes()
    with LlamaModel(path, ModelParams(populate=populate)) as model:
        return disk_read_bytes() - before, model.lazy_load


def test_the_hook_finds_libllamas_map_calls() -> None:
    redirected = load_hook.install()
    assert redirected >= 1, "libllama's mmap is not called through a slot the hook can redirect"
    assert load_hook.install() == redirected  # idempotent


def test_a_load_without_populate_reads_less_of_the_file(tiny_model_path: TinyModel) -> None:
    path = tiny_model_path("qwen3moe")
    full, lazy_full = load_reads(path, populate=True)
    size = path.stat().st_size
    if full < size // 2:
        pytest.skip(f"the disk's reads cannot be seen here ({full} bytes read for a {size}-byte load)")
    before = load_hook.stats()
    lazy, was_lazy = load_reads(path, populate=False)
    assert not lazy_full and was_lazy
    assert lazy < full // 2, f"the lazy load read {lazy} bytes, the full one {full}"
    after = load_hook.stats()
    assert after["populate_dropped"] > before["populate_dropped"]


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def open_reads(path: Path, populate: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[int, bool]:
    with monkeypatch.context() as m:
        if populate:
            m.setattr(load_hook, "install", lambda *_: 0)
        drop_from_page_cache(path)
        before = disk_read_bytes()
        stream = StreamConfig(enabled=True, cache_mb=None)
        with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
            return disk_read_bytes() - before, s.model.lazy_load


@pytest.fixture(scope="module")
def larger_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """113 MB, most of it experts: a tiny fixture is smaller than the read-ahead window some
    disks have (8 MiB on the VM this was written on), which reads it whole on any read."""
    shape = SyntheticShape(n_layer=4, n_embd=512, n_ff_exp=512, n_expert=64, n_expert_used=2, head_dim=64)
    return write_synthetic(tmp_path_factory.mktemp("lazy") / "model.gguf", shape, seed=1, progress=False)


def test_a_streamed_session_opens_without_reading_the_experts(
    larger_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = larger_model
    full, _ = open_reads(path, populate=True, monkeypatch=monkeypatch)
    size = path.stat().st_size
    if full < size // 2:
        pytest.skip(f"the disk's reads cannot be seen here ({full} bytes read for a {size}-byte open)")
    lazy, was_lazy = open_reads(path, populate=False, monkeypatch=monkeypatch)
    assert was_lazy
    assert lazy < size // 2, f"the lazy open read {lazy} of {size} bytes (the full one {full})"


def test_the_wrappers_pass_every_call_through_while_off(tiny_model_path: TinyModel) -> None:
    load_hook.install()
    before = load_hook.stats()
    with LlamaModel(tiny_model_path("qwen3moe"), ModelParams()) as model:
        assert not model.lazy_load
    assert load_hook.stats() == before


def run(path: Path, populate: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], np.ndarray, bool]:
    with monkeypatch.context() as m:
        if populate:
            m.setattr(load_hook, "install", lambda *_: 0)  # as if the hook could not be installed
        stream = StreamConfig(enabled=True, cache_mb=None)
        with Session.open(SessionConfig(model_path=path, context=PARAMS, stream=stream)) as s:
            tokens = list(s.generate(GenerateRequest("Hello, world", n_predict=8)).tokens)
            return tokens, s.last_logits(), s.model.lazy_load


@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss"])
def test_a_lazily_loaded_streamed_session_computes_the_same(
    name: str, tiny_model_path: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_model_path(name)
    lazy_tokens, lazy_logits, lazy = run(path, populate=False, monkeypatch=monkeypatch)
    full_tokens, full_logits, was_lazy = run(path, populate=True, monkeypatch=monkeypatch)
    assert lazy and not was_lazy
    assert lazy_tokens == full_tokens
    assert np.array_equal(lazy_logits, full_logits)
