"""``LlamaModel``: one loaded GGUF model, its vocabulary and metadata."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Protocol

import attrs
import llama_cpp

from bmoe.adapters.gguf_layout import read_header_values, validate_model_files
from bmoe.adapters.llama.devices import cpu_buffer_type
from bmoe.adapters.llama.log import capture_model_buffers, ensure_backend
from bmoe.cext import load_hook
from bmoe.domain.chat import with_one_bos
from bmoe.errors import ConfigError, ModelLoadError, TokenizeError


class Closable(Protocol):
    def close(self) -> None: ...


@attrs.frozen
class ModelParams:
    """How a model is loaded.

    The defaults are the ones streaming needs: the file is memory-mapped (tensors point into
    the mapping at their file offsets), nothing is offloaded, and weight repacking
    (``use_extra_bufts``) is off so expert tensors keep the file's layout (streaming repacks
    them itself, ``bmoe.adapters.llama.repack``). A resident session turns repacking on, as
    stock llama.cpp does.
    """

    use_mmap: bool = True
    # False: llama.cpp's mapping is not read ahead at load (bmoe.cext.load_hook drops its
    # MAP_POPULATE and WILLNEED): pages are read when first used. For streaming, which reads
    # the experts itself; where the hook cannot be installed the load reads as before
    populate: bool = True
    use_extra_bufts: bool = False
    vocab_only: bool = False
    n_expert_used: int | None = None  # override the model's top-k (lossy), 1..n_expert
    on_progress: Callable[[float], None] | None = None  # llama.cpp's load progress, 0..1
    # placement (docs/devices.md): the dense part of the last ``n_gpu_layers`` layers on
    # ``devices`` (ggml_backend_dev_t handles, adapters.llama.devices); tensors whose name
    # matches one of ``host_patterns`` stay in host memory (buffer-type overrides to the CPU)
    n_gpu_layers: int = 0
    devices: tuple[int, ...] = ()
    host_patterns: tuple[str, ...] = ()


def _expert_used_override(path: Path, k: int) -> tuple[str, int]:
    """The metadata override that sets a MoE model's top-k to ``k``; ``ConfigError`` for a
    model without routed experts or a ``k`` outside ``1..n_expert``."""
    arch = read_header_values(path, ["general.architecture"]).get("general.architecture")
    values = read_header_values(path, [f"{arch}.expert_count", f"{arch}.expert_used_count"])
    n_expert = int(values.get(f"{arch}.expert_count", 0))
    if n_expert <= 1:
        raise ConfigError(f"--n-expert-used: {path.name} ({arch}) has no routed experts")
    if not 1 <= k <= n_expert:
        raise ConfigError(f"--n-expert-used must be between 1 and the model's {n_expert} experts, not {k}")
    return f"{arch}.expert_used_count", k


class _BuftOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override`` (llama.h): a name pattern, a buffer type."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _placement_arrays(
    params: ModelParams,
) -> tuple[ctypes.Array[ctypes.c_void_p], ctypes.Array[_BuftOverride]]:
    """The NULL-terminated device list and buffer-type override list llama.cpp takes."""
    devices = (ctypes.c_void_p * (len(params.devices) + 1))(*params.devices, None)
    overrides = (_BuftOverride * (len(params.host_patterns) + 1))()
    if params.host_patterns:
        cpu = cpu_buffer_type()
        for i, pattern in enumerate(params.host_patterns):
            overrides[i].pattern = pattern.encode()
            overrides[i].buft = cpu
    return devices, overrides


class LlamaModel:
    """Owns a ``llama_model``; free it with ``close()`` or a ``with`` block."""

    def __init__(self, path: str | Path, params: ModelParams | None = None) -> None:
        params = params or ModelParams()
        self.path = Path(path)
        ensure_backend()
        validate_model_files(self.path)  # a broken file is named here, not left to llama.cpp
        cparams = llama_cpp.llama_model_default_params()
        cparams.n_gpu_layers = params.n_gpu_layers
        self._placement = _placement_arrays(params)  # llama.cpp reads them during the load
        if params.n_gpu_layers:
            cparams.devices = ctypes.cast(self._placement[0], ctypes.c_void_p)
        if params.host_patterns:
            cparams.tensor_buft_overrides = ctypes.cast(self._placement[1], ctypes.c_void_p)
        cparams.load_mode = (
            llama_cpp.LLAMA_LOAD_MODE_MMAP if params.use_mmap else llama_cpp.LLAMA_LOAD_MODE_NONE
        )
        cparams.use_extra_bufts = params.use_extra_bufts
        cparams.vocab_only = params.vocab_only
        self._n_expert_used: int | None = None
        overrides = None
        if params.n_expert_used is not None:
            key, value = _expert_used_override(self.path, params.n_expert_used)
            overrides = (llama_cpp.llama_model_kv_override * 2)()  # the second: the end marker
            overrides[0].key = key.encode()
            overrides[0].tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
            overrides[0].value.val_i64 = value  # type: ignore[union-attr]  # llama-cpp-python types the union loosely
            cparams.kv_overrides = overrides
            self._n_expert_used = value
        progress_ref = None
        if params.on_progress is not None:
            report = params.on_progress

            def progress(fraction: float, _user: ctypes.c_void_p) -> bool:
                report(float(fraction))
                return True

            progress_ref = llama_cpp.llama_progress_callback(progress)
            cparams.progress_callback = progress_ref
        # whether the load left the mapping to be read as used (ModelParams.populate)
        self.lazy_load = not params.populate and params.use_mmap and load_hook.install() > 0
        with capture_model_buffers() as buffers:
            load_hook.set_active(self.lazy_load)
            try:
                ptr = llama_cpp.llama_model_load_from_file(str(self.path).encode(), cparams)
            finally:
                load_hook.set_active(False)
        del progress_ref  # llama.cpp calls it during the load only
        # bytes per buffer type llama.cpp loaded the weights into (its log's figures)
        self.weight_buffers: dict[str, int] = dict(buffers)
        if not ptr:
            raise ModelLoadError(
                f"llama.cpp could not load {self.path} (not a GGUF, an unsupported architecture, "
                "or missing tensors; run with --verbose to see llama.cpp's reason)"
            )
        self._ptr: llama_cpp.llama_model_p | None = ptr
        self._after_free: list[Closable] = []
        self._vocab = llama_cpp.llama_model_get_vocab(ptr)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)

    # -- ownership -------------------------------------------------------------------------

    @property
    def ptr(self) -> llama_cpp.llama_model_p:
        if self._ptr is None:
            raise ValueError("the model is closed")
        return self._ptr

    def keep_until_closed(self, owner: Closable) -> None:
        """Close ``owner`` right after the model is freed (memory its tensors point into:
        repacked weight buffers)."""
        self._after_free.append(owner)

    def close(self) -> None:
        """Free the model (and what was to be freed after it)."""
        if self._ptr is not None:
            llama_cpp.llama_model_free(self._ptr)
            self._ptr = None
        while self._after_free:
            self._after_free.pop().close()

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- facts -----------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the key is absent."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    @property
    def repacked_bytes(self) -> int:
        """Bytes llama.cpp repacked at load (its ``CPU_REPACK`` buffers; 0 with repacking off)."""
        return self.weight_buffers.get("CPU_REPACK", 0)

    @property
    def arch(self) -> str:
        return self.meta("general.architecture") or "unknown"

    @property
    def n_layer(self) -> int:
        return int(llama_cpp.llama_model_n_layer(self.ptr))

    @property
    def n_params(self) -> int:
        """The model's parameters, all of them (llama.cpp's count)."""
        return int(llama_cpp.llama_model_n_params(self.ptr))

    @property
    def n_ctx_train(self) -> int:
        return int(llama_cpp.llama_model_n_ctx_train(self.ptr))

    @property
    def n_swa(self) -> int:
        """Sliding-window size of the SWA layers (0: no sliding window)."""
        return int(llama_cpp.llama_model_n_swa(self.ptr))

    @property
    def n_expert(self) -> int:
        value = self.meta(f"{self.arch}.expert_count")
        return int(value) if value else 0

    @property
    def n_expert_used(self) -> int:
        """The top-k the model runs with (an ``n_expert_used`` override if one was given)."""
        if self._n_expert_used is not None:
            return self._n_expert_used
        value = self.meta(f"{self.arch}.expert_used_count")
        return int(value) if value else 0

    @property
    def is_recurrent_or_hybrid(self) -> bool:
        return bool(llama_cpp.llama_model_is_recurrent(self.ptr)) or bool(
            llama_cpp.llama_model_is_hybrid(self.ptr)
        )

    @property
    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    @property
    def bos(self) -> int | None:
        """The BOS token id, or None when the vocabulary has none."""
        token = int(llama_cpp.llama_vocab_bos(self._vocab))
        return token if token >= 0 else None

    @property
    def add_bos(self) -> bool:
        """Whether prompts must start with BOS (``tokenizer.ggml.add_bos_token``)."""
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def token_text(self, token: int | None) -> str:
        """A special token's text as a chat template writes it (``""`` for None)."""
        if token is None or token < 0:
            return ""
        text = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return text.decode("utf-8", errors="replace") if text else ""

    @property
    def bos_text(self) -> str:
        return self.token_text(self.bos)

    @property
    def eos_text(self) -> str:
        token = int(llama_cpp.llama_vocab_eos(self._vocab))
        return self.token_text(token if token >= 0 else None)

    # -- vocabulary ------------------------------------------------------------------------

    def tokenize_prompt(self, text: str) -> list[int]:
        """A prompt (a rendered chat, or raw text) as the model must see it: specials
        parsed, and exactly one leading BOS when the model wants one (a template that wrote
        ``{{ bos_token }}`` itself does not get a second)."""
        return with_one_bos(self.tokenize(text, add_special=False), self.bos, self.add_bos)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; specials such as ``<|im_start|>`` are parsed by default."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TokenizeError(
                f"the text is not valid Unicode ({exc.reason} at character {exc.start}): cannot tokenize it"
            ) from exc
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise TokenizeError(f"llama_tokenize failed on {len(data)} bytes (code {n})")
        return list(buf[:n])

    @property
    def vocab(self) -> llama_cpp.llama_vocab_p:
        """The model's vocabulary (for samplers that need it: a grammar)."""
        vocab: llama_cpp.llama_vocab_p = self._vocab
        return vocab

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token stands for (control tokens render empty unless ``special``)."""
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ``<|im_end|>`` ...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
