"""``LlamaContext``: one llama.cpp context (KV/recurrent memory, compute threads) on a model."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Literal, Protocol

import attrs
import llama_cpp
import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType

from bmoe.adapters.cpu_topology import physical_cores
from bmoe.adapters.llama.embd_batch import EmbeddingBatch
from bmoe.adapters.llama.log import capture_compute_buffers, capture_kv_buffers
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.status import check_decode
from bmoe.errors import ConfigError, ContextInitError, ContextOverflowError, DecodeAbortedError

FlashAttn = Literal["auto", "on", "off"]
MAX_THREADS = 512  # GGML_MAX_N_THREADS (ggml.h): more crashes llama.cpp's thread pool
MAX_SEQUENCES = 256  # LLAMA_MAX_SEQ (llama-cparams.h): llama.cpp refuses more
_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


KV_CACHE_TYPES = {  # llama.cpp's -ctk / -ctv values -> ggml_type, as gguf-py numbers them
    name: int(GGMLQuantizationType[name.upper()])
    for name in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
}


class CCallback(Protocol):
    """A C function and its user data, owned by a Python object (see ``bmoe.cext``)."""

    @property
    def callback_address(self) -> int: ...

    @property
    def user_data_address(self) -> int: ...


@attrs.frozen
class ContextParams:
    """Fixed at creation: the context length, batch sizes and threads never change after.

    ``swa_full=False`` keeps only the window of sliding-window layers (less memory; a kept
    prefix may then have lost cells, see ``LlamaGenerateBackend.keep_prefix``).
    """

    n_ctx: int = 512  # the CLI's -c default: a short chat of a few turns fits
    n_batch: int = 64
    n_ubatch: int = 64
    n_threads: int = attrs.field(factory=physical_cores)  # one per physical core (-t)
    # off: on a 2-core x86 VM, auto (on) decoded 28% slower at 2,000 tokens of context and
    # prefilled no faster (docs/benchmarks.md); llama-cpp-python's Llama defaults to off too
    flash_attn: FlashAttn = "off"
    swa_full: bool = False
    # llama.cpp may run an op whose weights are in host memory on a device for a large
    # batch, copying the weights there first; streamed experts must be computed where they
    # are read (the copy would come before the read), so streaming with devices turns it off
    op_offload: bool = True
    # the KV cache's types, llama.cpp's -ctk / -ctv: a quantized cache takes less memory and
    # changes the output as it does in llama.cpp; a quantized V needs flash attention
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    # sequences one context holds (llama.cpp's -np): above 1, one KV cache of n_ctx cells
    # shared by all of them (llama.cpp's --kv-unified)
    n_seq_max: int = 1

    def __attrs_post_init__(self) -> None:
        if self.n_ctx < 8:
            raise ConfigError(f"n_ctx must be at least 8, not {self.n_ctx}")
        if not 1 <= self.n_seq_max <= MAX_SEQUENCES:
            raise ConfigError(
                f"parallel sequences must be between 1 and {MAX_SEQUENCES}, not {self.n_seq_max}"
            )
        if not 1 <= self.n_ubatch <= self.n_batch:
            raise ConfigError(f"need 1 <= n_ubatch <= n_batch, got {self.n_ubatch} and {self.n_batch}")
        if not 1 <= self.n_threads <= MAX_THREADS:
            raise ConfigError(
                f"n_threads must be between 1 and {MAX_THREADS} (ggml's limit), not {self.n_threads}"
            )
        if self.flash_attn not in _FLASH_ATTN:
            raise ConfigError(f"flash_attn must be one of {sorted(_FLASH_ATTN)}, not {self.flash_attn!r}")
        for flag, value in (("--cache-type-k", self.cache_type_k), ("--cache-type-v", self.cache_type_v)):
            if value not in KV_CACHE_TYPES:
                raise ConfigError(f"{flag} must be one of {', '.join(KV_CACHE_TYPES)}, not {value!r}")
        if self.cache_type_v not in ("f32", "f16", "bf16") and self.flash_attn == "off":
            raise ConfigError(
                f"--cache-type-v {self.cache_type_v} needs flash attention (-fa on or auto), as in llama.cpp"
            )


class LlamaContext:
    """Owns a ``llama_context`` and its batch; free with ``close()`` or a ``with`` block.

    One sequence (id 0). ``eval_callback`` (``cb_eval``, e.g. a ``RouteRecorder``) and
    ``abort`` (the abort callback, e.g. an ``AbortFlag``) are optional; the context keeps a
    reference to each so they live as long as it does.

    Three hooks a session may set: ``decode_lock`` is held around every ``llama_decode``
    call (so another thread can act at a decode boundary), ``before_decode`` is told the
    token count of each ``llama_decode`` before its lock is taken (a prompt-sized ubatch
    borrows the expert cache's room), and ``explain_abort`` runs when a decode was aborted,
    to raise the real cause (a streaming fault) instead of ``DecodeAbortedError``, on every
    path that decodes.

    ``feeding`` says how far the ``decode`` in flight (or the last one) went: ``(tokens
    decoded, tokens to decode)``, updated per ``n_batch`` chunk; any thread may read it
    (a prefill's progress).
    """

    def __init__(
        self,
        model: LlamaModel,
        params: ContextParams,
        *,
        eval_callback: CCallback | None = None,
        abort: CCallback | None = None,
    ) -> None:
        self.model = model
        self.params = params
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = params.n_ctx
        cparams.n_batch = params.n_batch
        cparams.n_ubatch = params.n_ubatch
        cparams.n_seq_max = params.n_seq_max
        cparams.kv_unified = params.n_seq_max > 1
        cparams.n_rs_seq = 0
        cparams.n_threads = params.n_threads
        cparams.n_threads_batch = params.n_threads
        cparams.flash_attn_type = _FLASH_ATTN[params.flash_attn]
        cparams.type_k = KV_CACHE_TYPES[params.cache_type_k]
        cparams.type_v = KV_CACHE_TYPES[params.cache_type_v]
        cparams.no_perf = True
        cparams.swa_full = params.swa_full
        cparams.op_offload = params.op_offload
        self._eval_callback = eval_callback
        self._cb_ref = None
        if eval_callback is not None:
            self._cb_ref = llama_cpp.ggml_backend_sched_eval_callback(eval_callback.callback_address)
            cparams.cb_eval = self._cb_ref
            cparams.cb_eval_user_data = ctypes.c_void_p(eval_callback.user_data_address)
        with capture_compute_buffers() as buffers, capture_kv_buffers() as kv:
            ptr = llama_cpp.llama_init_from_model(model.ptr, cparams)
        self.compute_buffers: dict[str, int] = buffers
        self.kv_buffers: dict[str, int] = kv
        if not ptr:
            raise ContextInitError(
                f"llama.cpp could not create a context of {params.n_ctx} tokens "
                "(not enough memory for the KV cache?)"
            )
        self._ptr: llama_cpp.llama_context_p | None = ptr
        self._abort = abort
        self._abort_ref = None
        if abort is not None:
            self._abort_ref = llama_cpp.ggml_abort_callback(abort.callback_address)
            llama_cpp.llama_set_abort_callback(ptr, self._abort_ref, ctypes.c_void_p(abort.user_data_address))
        self.n_ctx: int = int(llama_cpp.llama_n_ctx(ptr))
        self._batch = llama_cpp.llama_batch_init(params.n_batch, 0, 1)
        self._batch_live = True
        self.decode_lock: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        self.before_decode: Callable[[int], None] | None = None
        self.explain_abort: Callable[[], None] | None = None
        self.feeding: tuple[int, int] = (0, 0)

    @property
    def abort(self) -> CCallback | None:
        """The abort flag llama.cpp polls between graph nodes (None: none was given)."""
        return self._abort

    # -- ownership -------------------------------------------------------------------------

    @property
    def ptr(self) -> llama_cpp.llama_context_p:
        if self._ptr is None:
            raise ValueError("the context is closed")
        return self._ptr

    def close(self) -> None:
        if self._batch_live:
            llama_cpp.llama_batch_free(self._batch)
            self._batch_live = False
        if self._ptr is not None:
            llama_cpp.llama_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> LlamaContext:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def compute_buffer_bytes(self) -> int:
        """The compute buffers llama.cpp reserved for this context, all backends together
        (from its log, to 0.01 MiB; 0 if it logged none). It grows with ``n_ubatch``; it is
        allocated at creation but mostly untouched until a full ubatch runs."""
        return sum(self.compute_buffers.values())

    @property
    def kv_bytes(self) -> int:
        """The KV cache's buffers, all backends together (from llama.cpp's log, to 0.01 MiB;
        0 if it logged none). llama.cpp clears them when it creates the context: unlike the
        compute buffer, they are in memory from then on."""
        return sum(self.kv_buffers.values())

    # -- memory ----------------------------------------------------------------------------

    def clear(self) -> None:
        """Drop every cell of the KV / recurrent memory."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ptr), True)

    def remove_from(self, pos: int, seq: int = 0) -> bool:
        """Remove positions ``pos..end`` of sequence ``seq``; False when the memory refuses."""
        return bool(llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ptr), seq, pos, -1))

    def pos_min(self, seq: int = 0) -> int:
        """Smallest position the memory still holds for sequence ``seq`` (-1 when empty)."""
        return int(llama_cpp.llama_memory_seq_pos_min(llama_cpp.llama_get_memory(self.ptr), seq))

    # -- compute ---------------------------------------------------------------------------

    def decode(
        self,
        tokens: Sequence[int],
        start_pos: int,
        *,
        logits: Literal["last", "all", "none"] = "last",
        seq: int = 0,
    ) -> None:
        """Feed ``tokens`` at positions ``start_pos...`` of sequence ``seq``, in chunks of
        ``n_batch``.

        Logits are computed for the last token only (``"last"``), for every token (``"all"``)
        or for none (``"none"``: more of the prompt follows; llama.cpp then skips the last
        layer's FFN for these tokens, whose output no one reads).
        Raises ``ContextOverflowError`` before decoding anything if the tokens do not fit.
        """
        if not tokens:
            raise ConfigError("decode needs at least one token")
        if start_pos + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{start_pos + len(tokens)} tokens do not fit in the context of {self.n_ctx}"
            )
        step = self.params.n_batch
        batch = self._batch
        for begin in range(0, len(tokens), step):
            self.feeding = (begin, len(tokens))
            chunk = tokens[begin : begin + step]
            last_chunk = begin + step >= len(tokens)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = start_pos + begin + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = logits == "all" or (logits == "last" and last_chunk and i == len(chunk) - 1)
            batch.n_tokens = len(chunk)
            self._decode_batch()
        self.feeding = (len(tokens), len(tokens))

    def decode_step(
        self, entries: Sequence[tuple[int, int, int]], outputs: Sequence[bool] | None = None
    ) -> None:
        """One ``llama_decode`` of ``(token, position, sequence)`` entries (one token per
        running sequence, and chunks of joining prompts), logits for every one or for those
        ``outputs`` flags (output row ``i`` is entry ``i``'s). At most ``n_batch``."""
        if outputs is not None and len(outputs) != len(entries):
            raise ConfigError("one output flag per entry")
        if not 1 <= len(entries) <= self.params.n_batch:
            raise ConfigError(f"a step holds 1 to {self.params.n_batch} tokens, not {len(entries)}")
        batch = self._batch
        for i, (token, pos, seq) in enumerate(entries):
            if pos >= self.n_ctx:
                raise ContextOverflowError(f"position {pos} is past the context of {self.n_ctx}")
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = True if outputs is None else outputs[i]
        batch.n_tokens = len(entries)
        self._decode_batch()

    def decode_embeddings(
        self,
        rows: npt.NDArray[np.float32],
        positions: npt.NDArray[np.int32],
        *,
        last_logits: bool,
        causal: bool = True,
        seq: int = 0,
    ) -> None:
        """Feed embedding rows (an image's, ``[n, n_embd_inp]``) at ``positions``
        (``[sections, n]``: one section, or M-RoPE's four) in chunks of ``n_batch``, through
        the same decode boundary as tokens (the streaming hook sees every chunk). Logits
        for the last row when ``last_logits``. ``causal=False``: the rows attend to each
        other both ways (mtmd says which encoders want it)."""
        n = rows.shape[0]
        if int(positions.max()) >= self.n_ctx:
            raise ContextOverflowError(f"position {int(positions.max())} is past the context of {self.n_ctx}")
        step = self.params.n_batch
        if not causal:
            llama_cpp.llama_set_causal_attn(self.ptr, False)
        try:
            for begin in range(0, n, step):
                self.feeding = (begin, n)
                end = min(begin + step, n)
                chunk = EmbeddingBatch(
                    rows[begin:end], positions[:, begin:end], seq, last_logits=last_logits and end == n
                )
                self._decode_batch(chunk.batch)
        finally:
            if not causal:
                llama_cpp.llama_set_causal_attn(self.ptr, True)
        self.feeding = (n, n)

    def _decode_batch(self, batch: llama_cpp.llama_batch | None = None) -> None:
        """``llama_decode`` the prepared batch (or ``batch``), at a decode boundary the
        session controls; an abort is explained (a streaming fault raises as itself)."""
        batch = self._batch if batch is None else batch
        if self.before_decode is not None:
            self.before_decode(int(batch.n_tokens))
        with self.decode_lock:
            code = llama_cpp.llama_decode(self.ptr, batch)
        try:
            check_decode(code)
        except DecodeAbortedError:
            if self.explain_abort is not None:
                self.explain_abort()
            raise

    def decode_rows(self, tokens: Sequence[int], start_pos: int, first: int) -> npt.NDArray[np.float32]:
        """Feed ``tokens`` (in ``n_batch`` chunks) asking logits only for tokens ``first..``
        (as llama.cpp's perplexity tool does); returns them, ``[len - first, n_vocab]``."""
        if not 0 <= first < len(tokens):
            raise ConfigError(f"first output row {first} is outside the {len(tokens)} tokens")
        if start_pos + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{start_pos + len(tokens)} tokens do not fit in the context of {self.n_ctx}"
            )
        rows = np.empty((len(tokens) - first, self.model.n_vocab), dtype=np.float32)
        step = self.params.n_batch
        batch = self._batch
        for begin in range(0, len(tokens), step):
            chunk = tokens[begin : begin + step]
            n_out = 0
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = start_pos + begin + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = begin + i >= first
                n_out += begin + i >= first
            batch.n_tokens = len(chunk)
            self._decode_batch()
            for i in range(len(chunk) - n_out, len(chunk)):  # batch indices of the outputs
                rows[begin + i - first] = self.logits(i)
        return rows

    def decode_all_rows(self, tokens: Sequence[int], start_pos: int) -> npt.NDArray[np.float32]:
        """Feed ``tokens`` like ``decode`` and return the logits of every token, ``[n, n_vocab]``
        (read chunk by chunk: llama.cpp keeps only the last decode's output rows)."""
        rows = np.empty((len(tokens), self.model.n_vocab), dtype=np.float32)
        step = self.params.n_batch
        for begin in range(0, len(tokens), step):
            chunk = tokens[begin : begin + step]
            self.decode(chunk, start_pos + begin, logits="all")
            for i in range(len(chunk)):
                rows[begin + i] = self.logits(i)
        return rows

    def logits(self, index: int = -1) -> npt.NDArray[np.float32]:
        """A copy of one output row of logits (``-1``: the last one computed)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, index)
        if not ptr:
            raise ValueError(f"no logits for output row {index}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()
