"""Repacked weights (llama.cpp's ``CPU_REPACK`` layout): bmoe repacks exactly what llama.cpp
repacks, an expert repacked alone equals its slice of llama.cpp's whole-tensor repack, and
streamed == resident bit for bit with both repacked (tokens, logits, decisions, perplexity;
fast path and reference policy; the stock oracle too), on quantized models: Q4_0 and Q4_K
everywhere, Q8_0 everywhere, and the mixed-precision ``mixtral`` fixture (Q4_0 experts,
Q8_0 down projections in two layers). Repacking does nothing to F32, so an F32 model would
prove nothing here.

Which types have a repacked form depends on the CPU (on x86 with AVX2: Q4_0, Q4_K, IQ4_NL;
Q8_0 only on ARM): the gates compare with llama.cpp's own choice on this machine, and the
negative control shows the repacked layout changed the output wherever anything was repacked.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest

from bmoe.adapters.gguf_layout import read_layout
from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel, ModelParams
from bmoe.adapters.llama.repack import CpuRepack, buffer_type_name
from bmoe.cext import expert_stream, log_filter, weight_repack
from bmoe.domain.decide import DecideConfig, DecideRequest
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import EngineOptions, StreamConfig
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.machine import AMX_BROKEN, SAFE_AMX
from bmoe.testing.oracle import stock_greedy
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

AMX_IN_ID = True  # on an AMX machine each id says whether AMX was used or turned off
TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
REQUEST = GenerateRequest("The quick brown fox jumps over the lazy dog", n_predict=12)
SHAPE = SyntheticShape(n_layer=3, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2, head_dim=64)
MODELS = ["q4_0", "q4_k", "q8_0", "mixtral"]

REPACK = CpuRepack.find()
needs_repack = pytest.mark.skipif(REPACK is None, reason="this llama.cpp has no CPU_REPACK buffer type")

# Where llama.cpp's AMX tiles fault, every session here runs with --amx off (bmoe places the
# weights, AMX left out), and the comparisons with stock's own placement skip: stock puts
# weights in the AMX buffer type that faults. Where AMX works, both use it.
stock_places_in_broken_amx = pytest.mark.skipif(
    AMX_BROKEN, reason="stock llama.cpp places weights in AMX, whose tiles fault on this CPU"
)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: TinyModel) -> Callable[[str], Path]:
    """``quantized(name)``: a synthetic model quantized everywhere (dense and experts), or the
    mixed-precision fixture."""
    root = tmp_path_factory.mktemp("quantized")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name == "mixtral":
            return tiny_model_path("mixtral")
        if name not in made:
            shape = attrs.evolve(SHAPE, quant=name)
            made[name] = write_synthetic(root / f"{name}.gguf", shape, seed=3, progress=False)
        return made[name]

    return get


def session(path: Path, **kw: object) -> Session:
    kw.setdefault("amx", SAFE_AMX)
    return Session.open(SessionConfig(model_path=path, context=PARAMS, **kw))  # type: ignore[arg-type]


def streamed(path: Path, cache_mb: int | None = None, **kw: object) -> Session:
    stream = StreamConfig(enabled=True, cache_mb=cache_mb, **kw)  # type: ignore[arg-type]
    s = session(path, stream=stream)
    assert s.streaming is not None, s.notes
    return s


def generated(s: Session) -> tuple[tuple[int, ...], np.ndarray]:
    result = s.generate(REQUEST)
    return result.tokens, s.last_logits()


@contextlib.contextmanager
def stock_weights(path: Path) -> Iterator[dict[str, int]]:
    """``{name: tensor address}`` of every weight the graph reads, as llama.cpp loads the model
    with its defaults (weight repacking on); the tensors live while the block runs."""
    streamer = expert_stream.ExpertStreamer(n_layer=64, n_expert=1, n_proj=1)
    with LlamaModel(path, ModelParams(use_extra_bufts=True)) as model, LlamaContext(
        model, PARAMS, eval_callback=streamer
    ) as ctx:
        streamer.mode = expert_stream.MODE_CAPTURE
        ctx.decode([0], 0)
        yield {name: t for name, (t, _) in streamer.captured_weights().items()}


def stock_placement(path: Path) -> dict[str, str]:
    """The buffer type of every weight the graph reads, as llama.cpp loads the model."""
    with stock_weights(path) as weights:
        return {name: buffer_type_name(t) for name, t in weights.items()}


@needs_repack
@stock_places_in_broken_amx
@pytest.mark.parametrize("name", MODELS)
def test_bmoe_streaming_repacks_exactly_the_weights_llama_cpp_repacks(
    name: str, quantized: Callable[[str], Path]
) -> None:
    path = quantized(name)
    stock = stock_placement(path)
    with streamed(path) as s:
        assert s.streaming is not None
        ours = {
            name: buffer_type_name(t)
            for name, (t, _) in s.streaming.streaming.streamer.captured_weights().items()
        }
        info = s.streaming.info.repack
    assert ours == stock
    repacked = {n for n, buft in stock.items() if buft in ("CPU_REPACK", "AMX")}
    experts = {n for n in repacked if "_exps." in n}
    assert info.expert_tensors == len(experts)
    assert info.dense_tensors == len(repacked - experts)
    if name in ("q4_0", "q4_k", "mixtral"):  # every CPU with a Q4_0 / Q4_K repack (AVX2, NEON)
        assert experts, stock


@needs_repack
@pytest.mark.parametrize("name", ["q4_0", "q4_k", "mixtral"])
def test_one_expert_repacked_alone_equals_its_slice_of_llama_cpps_whole_tensor_repack(
    name: str, quantized: Callable[[str], Path]
) -> None:
    """The lanes' repack (a template of one expert's shape pointed at the slice) against the
    bytes llama.cpp's load-time repack of the whole tensor holds, for every expert."""
    assert REPACK is not None
    path = quantized(name)
    layout = read_layout(path)
    compared = 0
    with stock_weights(path) as weights:
        tag = weight_repack.alloc_buffer(REPACK.buft, 64)
        templates = weight_repack.Templates(64)
        try:
            with open(path, "rb") as f:
                for tensor_name, t in weights.items():
                    if "_exps." not in tensor_name or buffer_type_name(t) != "CPU_REPACK":
                        continue
                    info = weight_repack.tensor_info(t)
                    template = templates.add(t, tag)
                    assert template, tensor_name
                    slice_bytes = info["nb"][2]
                    loc = layout.tensors[tensor_name]
                    out = ctypes.create_string_buffer(slice_bytes)
                    for e in range(info["ne"][2]):
                        f.seek(loc.offset + e * slice_bytes)
                        weight_repack.repack_into(template, ctypes.addressof(out), f.read(slice_bytes))
                        theirs = ctypes.string_at(info["data"] + e * slice_bytes, slice_bytes)
                        assert out.raw == theirs, (tensor_name, e)
                        compared += 1
        finally:
            weight_repack.free_buffer(tag)
    assert compared > 0


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("policy", ["fast", "reference"])
@pytest.mark.parametrize("cache_mb", [0, 1, 1024])
def test_streamed_equals_resident_with_both_repacked(
    name: str, policy: str, cache_mb: int, quantized: Callable[[str], Path]
) -> None:
    """G1 cache off, G2 a cache of about one entry (evicting), G3 a cache holding it all."""
    path = quantized(name)
    with session(path) as s:
        tokens, logits = generated(s)
    with streamed(path, cache_mb, policy=policy) as s:
        got_tokens, got_logits = generated(s)
        assert s.streaming is not None and s.streaming.counters().misses > 0
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)


@pytest.mark.parametrize("name", ["q4_0", "q4_k", "mixtral"])
@pytest.mark.parametrize("odirect", [True, False])
def test_slow_lanes_and_buffered_reads_keep_the_repacked_output_exact(
    name: str, odirect: bool, quantized: Callable[[str], Path]
) -> None:
    """Each expert matmul waiting for its own projection while slow lanes repack the next
    ones; O_DIRECT (read into the bounce buffer, repacked from there) and buffered reads
    (read into the bounce buffer too: the repack reads another buffer than it writes)."""
    path = quantized(name)
    with session(path) as s:
        tokens, logits = generated(s)
    with streamed(path, None, odirect=odirect, engine=EngineOptions(lane_delay_us=1500)) as s:
        assert s.streaming is not None
        s.set_cache_budget(0)
        s.streaming.set_budget(2 * s.streaming.info.entry_bytes)
        got_tokens, got_logits = generated(s)
        assert s.streaming.counters().projection_waits > 0
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)


@needs_repack
@pytest.mark.parametrize("name", ["q4_0", "q4_k", "mixtral"])
def test_the_repacked_layout_changes_the_output_and_no_repack_keeps_the_files(
    name: str, quantized: Callable[[str], Path]
) -> None:
    """The negative control: with everything repacked the logits differ from the file
    layout's (so the gates above compare two different computations), and ``--no-repack``
    streams equal to ``--no-repack`` resident."""
    path = quantized(name)
    with session(path) as s:
        _, repacked = generated(s)
    with session(path, repack=False) as s:
        plain_tokens, plain = generated(s)
    with Session.open(
        SessionConfig(
            model_path=path,
            context=PARAMS,
            repack=False,
            amx=SAFE_AMX,
            stream=StreamConfig(enabled=True, cache_mb=1),
        )
    ) as s:
        assert s.streaming is not None and s.streaming.info.repack.summary().endswith("(--no-repack)")
        tokens, logits = generated(s)
    assert not np.array_equal(repacked, plain)
    assert tokens == plain_tokens and np.array_equal(logits, plain)


@pytest.mark.parametrize("name", ["q4_0", "q4_k"])
def test_resident_and_streamed_equal_stock_llama_cpp_with_its_defaults(
    name: str, quantized: Callable[[str], Path]
) -> None:
    """The stock oracle (``llama_cpp.Llama``, repacking on as by default) on a quantized
    model: bmoe resident and streamed give its tokens and logits."""
    path = quantized(name)
    prompt = REQUEST.prompt
    theirs, their_logits = stock_greedy(path, prompt, 10)
    for stream in (StreamConfig(), StreamConfig(enabled=True, cache_mb=1)):
        with session(path, stream=stream) as s:
            ours = s.generate(GenerateRequest(prompt, n_predict=10))
            assert list(ours.tokens) == theirs
            assert np.array_equal(s.last_logits(), their_logits)


@pytest.mark.parametrize("name", ["q4_0", "mixtral"])
@pytest.mark.parametrize("cache_mb", [0, 1024])
def test_streamed_decisions_and_perplexity_equal_resident_ones_with_both_repacked(
    name: str, cache_mb: int, quantized: Callable[[str], Path]
) -> None:
    path = quantized(name)
    task = "You control a phone. Task: turn on Wi-Fi. "
    asks = [
        DecideRequest(prefix=task, suffix="Screen: Home. A) Settings B) Camera.", choices=("A", "B")),
        DecideRequest(prefix=task, suffix="Screen: Settings. A) Network B) Display.", choices=("A", "B")),
    ]
    text = " ".join(["the quick brown fox jumps over a lazy dog while seven tired cats sleep"] * 12)
    results = []
    for stream in (StreamConfig(), StreamConfig(enabled=True, cache_mb=cache_mb)):
        decide = DecideConfig(enabled=True, prefix_cache="on")  # the same pieces both ways
        config = SessionConfig(
            model_path=path, context=PARAMS, chat=True, decide=decide, stream=stream, amx=SAFE_AMX
        )
        with Session.open(config) as s:
            got = [s.decide(a) for a in asks]
            ppl = s.perplexity_windows(text, n_ctx=64)
            results.append(([(r.best, r.choice_logp, r.n_reused) for r in got], ppl.ppl, ppl.count))
    assert results[0] == results[1]
    assert any(n for _, _, n in results[0][0])  # the kept prefix state was reused


def test_the_log_filter_drops_only_the_repack_debug_line() -> None:
    assert log_filter.dropped(1, b"repack: repack tensor blk.0.ffn_up_exps.weight with q4_0_8x8\n")
    assert not log_filter.dropped(2, b"repack: repack tensor blk.0.ffn_up_exps.weight with q4_0_8x8\n")
    assert not log_filter.dropped(1, b"load_tensors: CPU_REPACK model buffer size = 1.0 MiB\n")
    assert log_filter.callback_address() != 0
