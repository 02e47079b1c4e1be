"""One configuration, in its own process: load, teacher-force, print the figures.

The parent starts ``python -m bmoe.bench --child``, puts the process in the memory group
(if any), then writes the spec (one JSON line) to its stdin: nothing is loaded before the
process is in its group. After the load the child prefills the first
``spec["prompt_tokens"]`` tokens in one timed ``llama_decode`` (none when 0), then
teacher-forces the rest from there. It prints ``PROGRESS <tokens done>`` lines (the prompt's
tokens count once it is prefilled) and one ``RESULT <json>`` line at the end, on stdout.

Stock runs use llama-cpp-python's own owner classes (``llama_cpp._internals``, what its
``Llama`` class is built on) with llama.cpp's default model parameters (mmap; weight
repacking on unless the configuration turns it off) and ``Llama``'s default of flash
attention off; nothing of bmoe's is involved. bmoe runs open a ``Session`` with flash
attention off too, so the greedy choices of all configurations can be compared, and with
``Llama``'s batch sizes (``n_batch = n_ubatch = 512``, bmoe's own default is smaller) so
every configuration prefills the prompt in the same one ubatch.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bmoe.bench import procfs
from bmoe.bench.decode import Stepper, teacher_force
from bmoe.bench.prefill import PREFILL_BATCH, Prefiller, timed_prefill

PROGRESS_TAG = "PROGRESS "
RESULT_TAG = "RESULT "


class StockStepper:
    """Stock llama-cpp-python: model, context and batch of ``llama_cpp._internals``."""

    def __init__(self, model: Path, n_ctx: int, threads: int, *, repack: bool) -> None:
        import llama_cpp
        from llama_cpp import _internals

        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = repack  # llama.cpp's default is True (weights repacked)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = PREFILL_BATCH  # Llama's defaults (llama.cpp's n_batch: 2048)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # Llama(flash_attn=False)
        self._model = _internals.LlamaModel(path_model=str(model), params=mparams, verbose=False)
        self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=False)
        # room for the prompt; a decode step uses its first slot
        self._batch = _internals.LlamaBatch(n_tokens=PREFILL_BATCH, embd=0, n_seq_max=1, verbose=False)
        self.n_vocab = self._model.n_vocab()
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx.ctx))

    def prefill(self, tokens: Sequence[int]) -> None:
        self._batch.set_batch(tokens, 0, False)  # logits for the last token only
        self._ctx.decode(self._batch)

    def step(self, token: int, pos: int) -> None:
        self._batch.set_batch([token], pos, False)
        self._ctx.decode(self._batch)

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.ctypeslib.as_array(self._ctx.get_logits_ith(-1), shape=(self.n_vocab,))

    def argmax(self) -> int:
        return int(np.argmax(self.logits()))

    def close(self) -> None:
        self._batch.close()  # type: ignore[no-untyped-call]
        self._ctx.close()  # type: ignore[no-untyped-call]
        self._model.close()  # type: ignore[no-untyped-call]


class BmoeStepper:
    """A bmoe session, resident or streaming."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from bmoe.adapters.llama import ContextParams
        from bmoe.domain.streaming import StreamConfig
        from bmoe.runtime.session import Session, SessionConfig

        stream = StreamConfig(
            enabled=spec["kind"] == "stream",
            cache_mb=spec.get("cache_mib"),
            io_threads=spec["io_threads"],
            **spec.get("routing", {}),
        )
        config = SessionConfig(
            model_path=Path(spec["model"]),
            repack=spec.get("repack", True),
            context=ContextParams(
                n_ctx=spec["n_ctx"],
                n_batch=PREFILL_BATCH,
                n_ubatch=PREFILL_BATCH,
                n_threads=spec["threads"],
                flash_attn="off",
            ),
            stream=stream,
        )
        self.session = Session.open(config)
        self.n_ctx = self.session.n_ctx
        self.notes = list(self.session.notes)

    def prefill(self, tokens: Sequence[int]) -> None:
        self.session.ctx.decode(tokens, 0)  # one chunk: n_batch is PREFILL_BATCH

    def step(self, token: int, pos: int) -> None:
        self.session.ctx.decode([token], pos)

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        return self.session.last_logits()

    def argmax(self) -> int:
        return int(np.argmax(self.session.last_logits()))

    def counters(self) -> dict[str, float] | None:
        streaming = self.session.streaming
        if streaming is None:
            return None
        c = streaming.counters()
        return {
            "hits": c.hits,
            "misses": c.misses,
            "evictions": c.evictions,
            "rereads": c.rereads,
            "bytes_read": c.bytes_read,
            "bytes_landed": c.bytes_landed,
            "io_s": c.io_s,
            "mgmt_s": c.mgmt_s,
            "stall_s": c.stall_s,
            "stall_ahead_s": c.stall_ahead_s,
            "prefetch_issued": c.prefetch_issued,
            "prefetch_hits": c.prefetch_hits,
            "prefetch_wasted": c.prefetch_wasted,
            "decode_slots": c.decode_slots,
            "predict_slots": c.predict_slots,
            "predict_agree": c.predict_agree,
            "route_ahead_slots": c.route_ahead_slots,
            "route_ahead_agree": c.route_ahead_agree,
            "dropped": c.dropped,
            "substituted": c.substituted,
            "rank_s": c.rank_s,
            "issue_s": c.issue_s,
            # the wait for reads by MoE layer (``stall_layer_N``): where a token's stall sits
            **{f"stall_layer_{i}": s for i, s in enumerate(c.stall_layers)},
        }

    def stream_info(self) -> dict[str, Any] | None:
        streaming = self.session.streaming
        if streaming is None:
            return None
        info = streaming.info
        return {
            "budget_bytes": info.budget.bytes,
            "budget_warning": info.budget.warning,
            "odirect": info.odirect,
            "lanes": info.lanes,
            "token_cycle_bytes": info.token_cycle_bytes,
            "expert_bytes": info.expert_bytes,
            "dense_copied_bytes": info.dense_copied_bytes,
        }

    def close(self) -> None:
        self.session.close()


def _delta(after: dict[str, float] | None, before: dict[str, float] | None) -> dict[str, float] | None:
    if after is None or before is None:
        return None
    return {k: after[k] - before[k] for k in after}


def prefill_figures(stepper: StockStepper | BmoeStepper, tokens: Sequence[int]) -> dict[str, Any]:
    """Prefill ``tokens`` in one timed ``llama_decode``: its seconds and tok/s, what the
    kernel fetched from storage meanwhile, and for a streamed configuration what the
    streamer read for it and how long the compute waited for those reads."""
    counters = stepper.counters() if isinstance(stepper, BmoeStepper) else None
    read_start = procfs.read_bytes()
    prefiller: Prefiller = stepper
    done = timed_prefill(prefiller, tokens)
    read_end = procfs.read_bytes()
    out: dict[str, Any] = {
        "prompt_tokens": done.tokens,
        "prefill_s": done.seconds,
        "prefill_tok_s": done.tok_s,
    }
    if read_start is not None and read_end is not None:
        out["prefill_kernel_read_bytes"] = read_end - read_start
    if isinstance(stepper, BmoeStepper):
        read = _delta(stepper.counters(), counters)
        if read is not None:
            out["prefill_read_bytes"] = int(read["bytes_read"])
            out["prefill_landed_bytes"] = int(read["bytes_landed"])
            out["prefill_stall_s"] = read["stall_s"]
    return out


def run(spec: dict[str, Any], emit: Callable[..., None] = print) -> dict[str, Any]:
    """Load the configuration, wait ``spec["idle_s"]`` (if any), prefill the first
    ``spec["prompt_tokens"]`` of ``spec["tokens"]`` (if any), teacher-force the rest, return
    the figures."""
    import time

    t0 = time.perf_counter()
    kind = spec["kind"]
    stepper: StockStepper | BmoeStepper
    if kind.startswith("stock"):
        stepper = StockStepper(Path(spec["model"]), spec["n_ctx"], spec["threads"], repack=kind == "stock")
    else:
        stepper = BmoeStepper(spec)
    out: dict[str, Any] = {"key": spec["key"], "load_s": time.perf_counter() - t0, "n_ctx": stepper.n_ctx}
    try:
        out["after_load"] = procfs.status_bytes()
        out["peak_reset"] = procfs.reset_peak_rss()  # VmHWM from here on: the prefill's and the decode's
        if spec.get("idle_s", 0) > 0:  # an app whose first request comes a while after the load
            time.sleep(spec["idle_s"])
        prompt = int(spec.get("prompt_tokens", 0))
        if prompt:
            out.update(prefill_figures(stepper, spec["tokens"][:prompt]))
            emit(f"{PROGRESS_TAG}{prompt}", flush=True)
        marks: dict[str, Any] = {}

        def measure_start() -> None:
            marks["read_bytes"] = procfs.read_bytes()
            marks["busy"], marks["own"] = procfs.cpu_busy_s(), procfs.own_cpu_s()
            marks["t"] = time.perf_counter()
            if isinstance(stepper, BmoeStepper):
                marks["counters"] = stepper.counters()

        def on_token(done: int) -> None:
            emit(f"{PROGRESS_TAG}{prompt + done}", flush=True)

        steps: Stepper = stepper
        decode = teacher_force(
            steps,
            spec["tokens"],
            spec["warmup"],
            spec["measure"],
            max_seconds=spec["max_seconds"],
            on_token=on_token,
            on_measure_start=measure_start,
            start=prompt,
        )
        read_end = procfs.read_bytes()
        wall = time.perf_counter() - marks["t"]
        busy, own = procfs.cpu_busy_s() - marks["busy"], procfs.own_cpu_s() - marks["own"]
        out["other_cpu_cores"] = max(0.0, busy - own) / wall if wall > 0 else 0.0
        out["finite_logits"] = bool(np.all(np.isfinite(stepper.logits())))
        out["argmax"] = decode.argmax
        out["warmup_tokens"] = decode.warmup
        out["measured_tokens"] = decode.measured
        out["decode_s"] = decode.wall_s
        out["tok_s"] = decode.tok_s
        out["step_ms_median"] = decode.step_ms_median
        out["step_s"] = [round(s, 6) for s in decode.step_s]
        out["notes"] = decode.notes
        if read_end is not None and marks["read_bytes"] is not None:
            out["kernel_read_bytes"] = read_end - marks["read_bytes"]
        if isinstance(stepper, BmoeStepper):
            out["notes"] = stepper.notes + decode.notes
            out["counters"] = _delta(stepper.counters(), marks.get("counters"))
            out["stream_info"] = stepper.stream_info()
        out["end"] = procfs.status_bytes()  # VmHWM: the prefill's and decode's peak (since the reset)
    finally:
        stepper.close()
    if not math.isfinite(out.get("tok_s", 0.0)):
        out["tok_s"] = 0.0
    return out


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    result = run(spec)
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0
