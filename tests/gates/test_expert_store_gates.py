"""The expert store (``python -m bmoe.store``, ``--expert-store``): the experts written once
in llama.cpp's repacked layout and read from there straight into the cache's slices.

- streamed from the store == resident bit for bit (tokens and last logits), on the quantized
  models whose experts llama.cpp repacks here, cache off / one entry / all of it, fast path
  and reference policy, ``O_DIRECT`` (most bytes read in place) and buffered reads;
- a store that does not serve is not used, and says why: another model file, another
  llama.cpp build, a file cut short, slices that are not what this llama.cpp writes (the
  repack check at each start); ``auto`` streams from the model file as without one (the same
  output), a store named by its path is an ``ExpertStoreError``;
- the command: says where and how much, writes, checks, and does not write again a store
  that serves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest

from bmoe.adapters.expert_store_file import default_store_path, manifest_path
from bmoe.adapters.gguf_layout import read_layout
from bmoe.adapters.llama import ContextParams
from bmoe.adapters.llama.repack import CpuRepack
from bmoe.adapters.usage_profile_file import model_key
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import EngineOptions, StreamConfig
from bmoe.errors import ExpertStoreError
from bmoe.runtime import Session, SessionConfig
from bmoe.store.__main__ import main as store_command
from bmoe.testing.machine import SAFE_AMX
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
REQUEST = GenerateRequest("The quick brown fox jumps over the lazy dog", n_predict=12)
SHAPE = SyntheticShape(n_layer=3, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2, head_dim=64)

pytestmark = pytest.mark.skipif(
    CpuRepack.find() is None, reason="this llama.cpp has no CPU_REPACK buffer type"
)


@pytest.fixture(autouse=True)
def store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "stores"
    monkeypatch.setenv("BMOE_STORE_DIR", str(folder))
    return folder


@pytest.fixture(scope="module")
def quantized(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Callable[..., Path]
) -> Callable[..., Path]:
    """``quantized(name, seed=3)``: a synthetic model quantized everywhere, or ``mixtral``
    (Q4_0 experts, Q8_0 down projections in two layers)."""
    root = tmp_path_factory.mktemp("store-models")
    made: dict[tuple[str, int], Path] = {}

    def get(name: str, seed: int = 3) -> Path:
        if name == "mixtral":
            return tiny_model_path("mixtral")
        if (name, seed) not in made:
            shape = attrs.evolve(SHAPE, quant=name)
            made[name, seed] = write_synthetic(root / f"{name}-{seed}.gguf", shape, seed=seed, progress=False)
        return made[name, seed]

    return get


def session(path: Path, stream: StreamConfig | None = None) -> Session:
    return Session.open(
        SessionConfig(model_path=path, context=PARAMS, amx=SAFE_AMX, stream=stream or StreamConfig())
    )


def generated(s: Session) -> tuple[tuple[int, ...], np.ndarray]:
    return s.generate(REQUEST).tokens, s.last_logits()


def resident(path: Path) -> tuple[tuple[int, ...], np.ndarray]:
    with session(path) as s:
        return generated(s)


def write(path: Path, *more: str) -> int:
    return store_command(["-m", str(path), *more])


@pytest.fixture
def stored(quantized: Callable[..., Path]) -> Iterator[Callable[[str], Path]]:
    def get(name: str) -> Path:
        path = quantized(name)
        assert write(path) == 0
        return path

    yield get


def store_of(model: Path) -> Path:
    return default_store_path(model_key(read_layout(model).paths))


@pytest.mark.parametrize("name", ["q4_0", "q4_k", "mixtral"])
@pytest.mark.parametrize("cache_mb", [0, 1, None])
@pytest.mark.parametrize("policy", ["fast", "reference"])
def test_streamed_from_the_store_equals_resident(
    name: str, cache_mb: int | None, policy: str, stored: Callable[[str], Path]
) -> None:
    path = stored(name)
    tokens, logits = resident(path)
    with session(path, StreamConfig(enabled=True, cache_mb=cache_mb, policy=policy)) as s:
        assert s.streaming is not None
        assert s.streaming.info.store.path == store_of(path), s.notes
        assert any("from the store" in n for n in s.notes)
        got_tokens, got_logits = generated(s)
        counters = s.streaming.counters()
        assert counters.misses > 0
        if policy == "fast":  # read in place: the slices' whole pages (of 9-page slices, most)
            assert counters.bytes_in_place > (counters.bytes_landed / 2 if name != "mixtral" else 0)
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)


@pytest.mark.parametrize("odirect", [True, False])
def test_buffered_reads_and_o_direct_from_the_store_give_the_same_output(
    odirect: bool, stored: Callable[[str], Path]
) -> None:
    path = stored("q4_0")
    tokens, logits = resident(path)
    with session(path, StreamConfig(enabled=True, cache_mb=1, odirect=odirect)) as s:
        assert s.streaming is not None and s.streaming.info.store.path is not None
        got_tokens, got_logits = generated(s)
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)


def _streams_from_the_model_file(path: Path, why: str) -> None:
    """``auto`` refuses the store, says ``why``, and streams from the model file exactly."""
    tokens, logits = resident(path)
    with session(path, StreamConfig(enabled=True, cache_mb=1)) as s:
        assert s.streaming is not None
        assert s.streaming.info.store.path is None
        notes = " ".join(s.notes)
        assert "not used" in notes and why in notes, s.notes
        got_tokens, got_logits = generated(s)
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)


def _rewrite_manifest(store: Path, **fields: object) -> None:
    doc = json.loads(manifest_path(store).read_text())
    doc.update(fields)
    manifest_path(store).write_text(json.dumps(doc))


def test_a_store_of_another_model_file_is_refused(quantized: Callable[..., Path], tmp_path: Path) -> None:
    """The manifest of another model's store copied under this model's key: refused, then
    named by its path: an error."""
    path, other = quantized("q4_0"), quantized("q4_0", seed=4)
    assert write(other) == 0
    mine, theirs = store_of(path), store_of(other)
    mine.write_bytes(theirs.read_bytes())
    manifest_path(mine).write_text(manifest_path(theirs).read_text())
    _streams_from_the_model_file(path, "another model file")
    with pytest.raises(ExpertStoreError, match="another model file"):
        session(path, StreamConfig(enabled=True, expert_store=str(mine)))


def test_a_store_of_another_llama_cpp_build_is_refused(stored: Callable[[str], Path]) -> None:
    path = stored("q4_0")
    _rewrite_manifest(store_of(path), library_key="0" * 24)
    _streams_from_the_model_file(path, "another llama.cpp build")


def test_a_store_cut_short_is_refused(stored: Callable[[str], Path]) -> None:
    path = stored("q4_0")
    store = store_of(path)
    with open(store, "r+b") as f:
        f.truncate(store.stat().st_size - 4096)
    _streams_from_the_model_file(path, "cut or replaced")


def test_slices_this_llama_cpp_would_not_write_are_refused(stored: Callable[[str], Path]) -> None:
    """The repack check: the first tensor's sampled slice (expert 11 % 8 = 3) changed in the
    store: the bytes llama.cpp writes now differ, so the store is not used."""
    path = stored("q4_0")
    store = store_of(path)
    doc = json.loads(manifest_path(store).read_text())
    first = doc["tensors"][0]
    at = first["store_offset"] + 3 * (first["n_bytes"] // SHAPE.n_expert) + 100
    with open(store, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    _streams_from_the_model_file(path, first["name"])
    with pytest.raises(ExpertStoreError, match="write the store again"):
        session(path, StreamConfig(enabled=True, expert_store=str(store)))


def test_a_named_store_that_is_not_there_is_an_error(quantized: Callable[..., Path], tmp_path: Path) -> None:
    with pytest.raises(ExpertStoreError, match="no store there"):
        session(quantized("q4_0"), StreamConfig(enabled=True, expert_store=str(tmp_path / "none.experts")))


def test_off_and_no_repack_read_the_model_file(stored: Callable[[str], Path]) -> None:
    path = stored("q4_0")
    with session(path, StreamConfig(enabled=True, expert_store="off")) as s:
        assert s.streaming is not None and s.streaming.info.store.path is None
    config = SessionConfig(model_path=path, context=PARAMS, amx=SAFE_AMX, repack=False)
    with Session.open(attrs.evolve(config, stream=StreamConfig(enabled=True))) as s:
        assert s.streaming is not None and s.streaming.info.store.path is None


def test_the_command_says_writes_checks_and_keeps(
    quantized: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = quantized("q4_k")
    out = tmp_path / "elsewhere" / "q4_k.experts"
    assert write(path, "--out", str(out), "--check") == 1
    assert "does not serve: no store there" in capsys.readouterr().out
    assert write(path, "--out", str(out)) == 0
    said = capsys.readouterr().out
    assert "writing" in said and str(out) in said and "written and checked" in said
    assert write(path, "--out", str(out), "--check") == 0
    assert write(path, "--out", str(out)) == 0
    assert "already written" in capsys.readouterr().out
    tokens, logits = resident(path)
    with session(path, StreamConfig(enabled=True, cache_mb=1, expert_store=str(out))) as s:
        assert s.streaming is not None and s.streaming.info.store.path == out
        got_tokens, got_logits = generated(s)
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)


def test_the_command_refuses_where_the_folder_has_not_the_room(
    quantized: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shutil

    from bmoe.adapters import expert_store_file

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(expert_store_file.shutil, "disk_usage", lambda _: usage._replace(free=1024))
    out = tmp_path / "full" / "q4_0.experts"
    assert write(quantized("q4_0"), "--out", str(out)) == 1
    assert "needs" in capsys.readouterr().err and not out.exists()


def test_the_plan_says_whether_the_model_has_a_store(quantized: Callable[..., Path]) -> None:
    from bmoe.runtime.planning import store_line

    path = quantized("q4_0", seed=6)
    assert store_line(read_layout(path)).startswith("no expert store (python -m bmoe.store")
    assert write(path) == 0
    assert (
        store_line(read_layout(path)) == f"expert store {store_of(path)} (its experts read without a repack)"
    )


@pytest.mark.parametrize("name", ["q4_0", "mixtral"])
@pytest.mark.parametrize("policy", ["fast", "reference"])
def test_the_store_read_into_shuffled_rows_equals_resident(
    name: str, policy: str, stored: Callable[[str], Path]
) -> None:
    """Each expert read from the store into another row of its tensors (``rows.pxi``; in place
    where the row's address meets the store's offset modulo a page, as whole slices do)."""
    path = stored(name)
    tokens, logits = resident(path)
    engine = EngineOptions(rank_worker=True, expert_rows="shuffled")
    with session(path, StreamConfig(enabled=True, cache_mb=1, policy=policy, engine=engine)) as s:
        assert s.streaming is not None and s.streaming.info.store.path == store_of(path)
        got_tokens, got_logits = generated(s)
        assert s.streaming.streaming.streamer.stats()["rows_rewritten"] > 0
        counters = s.streaming.counters()
        if policy == "fast" and name == "q4_0":
            assert counters.bytes_in_place > counters.bytes_landed / 2
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)
