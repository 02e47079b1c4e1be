"""One configuration, in its own process: load, teacher-force, print the figures.

The parent starts ``python -m bmoe.bench --child``, puts the process in the memory group
(if any), then writes the spec (one JSON line) to its stdin: nothing is loaded before the
process is in its group. After the load the child prefills the first
``spec["prompt_tokens"]`` tokens, timed, in batches of ``spec["batch"]`` (none when 0), then
teacher-forces the rest from there. It prints ``PROGRESS <tokens done>`` lines (the prompt's
tokens count once it is prefilled) and one ``RESULT <json>`` line at the end, on stdout.

Stock runs use llama-cpp-python's own owner classes (``llama_cpp._internals``, what its
``Llama`` class is built on) with llama.cpp's default model parameters (mmap; weight
repacking on unless the configuration turns it off) and ``Llama``'s default of flash
attention off; nothing of bmoe's is involved. bmoe runs open a ``Session`` with flash
attention off too, so the greedy choices of all configurations can be compared, and with
``Llama``'s batch sizes (``n_batch = n_ubatch = 512``, bmoe's own default is smaller) or the
``--batch-size`` asked, so every configuration prefills the prompt in the same ubatches;
with ``--batch-size auto`` bmoe's streamed ones size theirs from the memory room.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from bmoe.adapters.process_usage import faults_and_system
from bmoe.bench import procfs
from bmoe.bench.decode import (
    Decode,
    ParallelDecode,
    ParallelStepper,
    Stepper,
    teacher_force,
    teacher_force_parallel,
)
from bmoe.bench.draft_decode import DraftedDecode, teacher_force_drafted
from bmoe.bench.prefill import AUTO_BATCH, PREFILL_BATCH, Prefiller, context_batch, timed_prefill
from bmoe.domain.drafting import DraftPolicy

PROGRESS_TAG = "PROGRESS "
RESULT_TAG = "RESULT "


class StockStepper:
    """Stock llama-cpp-python: model, context and batch of ``llama_cpp._internals``."""

    def __init__(
        self,
        model: Path,
        n_ctx: int,
        threads: int,
        *,
        repack: bool,
        n_seq: int = 1,
        batch: int = PREFILL_BATCH,
    ) -> None:
        import llama_cpp
        from llama_cpp import _internals

        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = repack  # llama.cpp's default is True (weights repacked)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = batch  # Llama's defaults: 512 (llama.cpp's n_batch: 2048)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # Llama(flash_attn=False)
        # several sequences share one KV cache, as llama-server's default (-np auto: --kv-unified)
        cparams.n_seq_max = n_seq
        cparams.kv_unified = n_seq > 1
        self._model = _internals.LlamaModel(path_model=str(model), params=mparams, verbose=False)
        self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=False)
        # room for a batch of the prompt; a decode step uses its first slot
        self._batch = _internals.LlamaBatch(n_tokens=batch, embd=0, n_seq_max=1, verbose=False)
        self.n_vocab = self._model.n_vocab()
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx.ctx))
        self.n_ubatch = batch

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        """In batches of ``n_batch``, as ``Llama.eval`` feeds a prompt; logits for the last
        token only."""
        n_batch = self.n_ubatch
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start : start + n_batch]
            self._batch.reset()  # type: ignore[no-untyped-call]
            self._batch.add_sequence(chunk, seq, False)  # positions 0.. of the chunk, last logits
            batch = self._batch.batch
            for i in range(len(chunk)):
                batch.pos[i] = start + i
            self._ctx.decode(self._batch)

    def step(self, token: int, pos: int) -> None:
        self._batch.set_batch([token], pos, False)
        self._ctx.decode(self._batch)

    def step_all(self, entries: Sequence[tuple[int, int, int]]) -> None:
        batch = self._batch.batch
        for i, (token, pos, seq) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, True
            batch.seq_id[i][0] = seq
        batch.n_tokens = len(entries)
        self._ctx.decode(self._batch)

    def argmax_row(self, row: int) -> int:
        row_logits = np.ctypeslib.as_array(self._ctx.get_logits_ith(row), shape=(self.n_vocab,))
        return int(np.argmax(row_logits))

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.ctypeslib.as_array(self._ctx.get_logits_ith(-1), shape=(self.n_vocab,))

    def argmax(self) -> int:
        return int(np.argmax(self.logits()))

    def close(self) -> None:
        self._batch.close()  # type: ignore[no-untyped-call]
        self._ctx.close()  # type: ignore[no-untyped-call]
        self._model.close()  # type: ignore[no-untyped-call]


_COUNTED = """
hits misses evictions rereads bytes_read bytes_landed io_s mgmt_s stall_s stall_ahead_s
prefetch_issued prefetch_hits prefetch_wasted decode_slots predict_slots predict_agree
route_ahead_slots route_ahead_agree dropped substituted land_s lane_cpu_s rank_s issue_s
cross_evictions twin_misses twin_cross_evictions victims_switches pages_recycled rows_swapped
"""
COUNTED = tuple(_COUNTED.split())
"""The streamer's counters each measured stretch records (differences of ``StreamCounters``)."""


class BmoeStepper:
    """A bmoe session, resident or streaming."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from bmoe.adapters.llama import ContextParams
        from bmoe.domain.streaming import StreamConfig
        from bmoe.runtime import Session, SessionConfig

        streamed = spec["kind"] == "stream"
        batch = spec.get("batch", PREFILL_BATCH)
        sized = batch == AUTO_BATCH and streamed  # the batch from the room, as bmoe.cli's default
        n_batch = context_batch(batch)
        stream = StreamConfig(
            enabled=streamed,
            cache_mb=spec.get("cache_mib"),
            io_threads=spec["io_threads"],
            size_prompt_batch=sized,
            **spec.get("routing", {}),
        )
        config = SessionConfig(
            model_path=Path(spec["model"]),
            repack=spec.get("repack", True),
            context=ContextParams(
                n_ctx=spec["n_ctx"],
                n_batch=n_batch,
                n_ubatch=n_batch,
                n_threads=spec["threads"],
                flash_attn="off",
                n_seq_max=spec.get("parallel", 1),
            ),
            stream=stream,
        )
        self.session = Session.open(config)
        self.n_ctx = self.session.n_ctx
        self.n_ubatch = self.session.ctx.params.n_ubatch  # the one chosen where sized
        self.notes = list(self.session.notes)

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        self.session.ctx.decode(tokens, 0, seq=seq)  # in n_batch chunks

    def step(self, token: int, pos: int) -> None:
        self.session.ctx.decode([token], pos)

    def step_all(self, entries: Sequence[tuple[int, int, int]]) -> None:
        self.session.ctx.decode_step(entries)

    def argmax_row(self, row: int) -> int:
        return int(np.argmax(self.session.ctx.logits(row)))

    def experts(self) -> tuple[int, int]:
        """The model's routed experts a layer and its top-k (a verify's price)."""
        model = self.session.model
        return (model.n_expert, model.n_expert_used)

    def step_rows(self, tokens: Sequence[int], pos: int) -> np.ndarray[Any, Any]:
        """A verify, fed by the session's own backend (one decode step of its rows)."""
        return self.session.engine.backend.feed_rows(tokens, pos)

    def cut(self, keep: int) -> None:
        if not self.session.engine.backend.keep_prefix(keep):
            raise RuntimeError("the context's memory refused to drop a rejected draft")

    def decode_sequences(self, n: int) -> None:
        """The decode steps to come hold ``n`` sequences (the streamer counts them as decode)."""
        if self.session.streaming is not None:
            self.session.streaming.set_decode_rows(n)

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        return self.session.last_logits()

    def argmax(self) -> int:
        return int(np.argmax(self.session.last_logits()))

    def counters(self) -> dict[str, float] | None:
        streaming = self.session.streaming
        if streaming is None:
            return None
        c = streaming.counters()
        # the wait for reads by MoE layer (``stall_layer_N``): where a token's stall sits
        stalls = {f"stall_layer_{i}": s for i, s in enumerate(c.stall_layers)}
        return {**{name: getattr(c, name) for name in COUNTED}, **stalls}

    def stream_info(self) -> dict[str, Any] | None:
        streaming = self.session.streaming
        if streaming is None:
            return None
        info = streaming.info
        return {
            "budget_bytes": info.budget.bytes,
            "budget_end_bytes": streaming.counters().budget_bytes,  # after the prompt, the governor
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


def prefill_figures(stepper: StockStepper | BmoeStepper, prompts: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Prefill each of ``prompts`` (one per sequence, sequence ``s`` the ``s``-th) in one timed
    ``llama_decode`` each: their seconds and tok/s together, what the kernel fetched from
    storage meanwhile, and for a streamed configuration what the streamer read for them and
    how long the compute waited for those reads."""
    counters = stepper.counters() if isinstance(stepper, BmoeStepper) else None
    read_start = procfs.read_bytes()
    faults0, system0 = faults_and_system()
    prefiller: Prefiller = stepper
    done = [timed_prefill(prefiller, tokens, seq=s) for s, tokens in enumerate(prompts)]
    faults1, system1 = faults_and_system()
    read_end = procfs.read_bytes()
    tokens, seconds = sum(d.tokens for d in done), sum(d.seconds for d in done)
    out: dict[str, Any] = {
        "prompt_tokens": tokens,
        "prefill_ubatch": stepper.n_ubatch,
        "prefill_s": seconds,
        "prefill_tok_s": tokens / seconds if seconds > 0 else 0.0,
        "prefill_minor_faults": faults1 - faults0,
        "prefill_system_s": system1 - system0,
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
    ``spec["prompt_tokens"]`` of the text (if any), teacher-force the rest, return the
    figures. With ``spec["texts"]`` (one text per sequence; ``spec["parallel"]`` of them),
    every sequence's prompt is prefilled on its own and each decode step holds one token of
    every sequence."""
    import time

    t0 = time.perf_counter()
    kind = spec["kind"]
    texts: list[list[int]] = spec.get("texts") or [spec["tokens"]]
    stepper: StockStepper | BmoeStepper
    if kind.startswith("stock"):
        batch = spec.get("batch", PREFILL_BATCH)
        stepper = StockStepper(
            Path(spec["model"]),
            spec["n_ctx"],
            spec["threads"],
            repack=kind == "stock",
            n_seq=len(texts),
            batch=context_batch(batch),
        )
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
            out.update(prefill_figures(stepper, [text[:prompt] for text in texts]))
            emit(f"{PROGRESS_TAG}{prompt * len(texts)}", flush=True)
        marks: dict[str, Any] = {}

        def measure_start() -> None:
            marks["read_bytes"] = procfs.read_bytes()
            marks["busy"], marks["own"] = procfs.cpu_busy_s(), procfs.own_cpu_s()
            marks["faults"], marks["system"] = faults_and_system()
            marks["t"] = time.perf_counter()
            if isinstance(stepper, BmoeStepper):
                marks["counters"] = stepper.counters()

        def on_token(done: int) -> None:
            emit(f"{PROGRESS_TAG}{(prompt + done) * len(texts)}", flush=True)

        common = dict(max_seconds=spec["max_seconds"], on_measure_start=measure_start, start=prompt)
        if spec.get("draft") == "copy" and isinstance(stepper, BmoeStepper):
            drafted = teacher_force_drafted(
                stepper,
                texts[0],
                measure=spec["measure"],
                policy=DraftPolicy(experts=stepper.experts()),
                warmup=spec["warmup"],
                on_token=on_token,
                **common,
            )
            out["drafts"] = attrs.asdict(drafted.drafts)
            decode: Decode | ParallelDecode | DraftedDecode = drafted
        elif "texts" in spec:
            if isinstance(stepper, BmoeStepper):
                stepper.decode_sequences(len(texts))
            steps: ParallelStepper = stepper
            decode = teacher_force_parallel(
                steps, texts, spec["warmup"], spec["measure"], on_step=on_token, **common
            )
        else:
            one: Stepper = stepper
            decode = teacher_force(
                one, texts[0], spec["warmup"], spec["measure"], on_token=on_token, **common
            )
        read_end = procfs.read_bytes()
        wall = time.perf_counter() - marks["t"]
        faults, system = faults_and_system()
        busy, own = procfs.cpu_busy_s() - marks["busy"], procfs.own_cpu_s() - marks["own"]
        out["other_cpu_cores"] = max(0.0, busy - own) / wall if wall > 0 else 0.0
        out["finite_logits"] = bool(np.all(np.isfinite(stepper.logits())))
        if isinstance(decode, ParallelDecode):
            out["parallel"] = decode.sequences
            out["seq_tok_s"] = decode.seq_tok_s
            out["seq_argmax"] = decode.argmax
            out["argmax"] = [token for seq in decode.argmax for token in seq]  # sequence by sequence
        else:
            out["argmax"] = decode.argmax
        out["warmup_tokens"] = decode.warmup
        out["measured_tokens"] = decode.measured  # generated: steps x sequences
        out["minor_faults"] = faults - marks["faults"]  # over the measured tokens
        out["system_s"] = system - marks["system"]
        out["decode_s"] = decode.wall_s
        out["tok_s"] = decode.tok_s  # aggregate over the sequences
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
    if "mode" in spec:  # bench --draft copy's other measures
        from bmoe.bench.draft_child import run_mode

        result = run_mode(spec)
    else:
        result = run(spec)
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0
