"""Weights in llama.cpp's repacked layout (``CPU_REPACK``) for a model loaded without it.

Stock llama.cpp repacks at load (``use_extra_bufts``): every weight whose matmul its CPU
backend has a repacked kernel for is copied into a ``CPU_REPACK`` buffer, interleaved for
the SIMD kernels. That copies the whole model into anonymous memory, which streaming
cannot afford, so a streamed model is loaded with repacking off and repacked here, weight
by weight, exactly as llama.cpp decides and does it:

- which weights: those llama.cpp's loader would place in ``CPU_REPACK`` (the op each feeds,
  as the capture decode saw it, tested on the CPU device with a stand-in in that buffer
  type: ``weight_repack.supported``);
- dense weights move into one buffer per extra buffer type, in the order llama.cpp's
  loader tries them (``AMX`` before ``CPU_REPACK`` where it offers AMX and bmoe does not
  refuse it: ``bmoe.domain.cpu_features``), allocated and filled by llama.cpp;
- routed-expert tensors keep the streamer's memory, get the buffer type's traits, and
  each expert is repacked by llama.cpp as a lane reads it (``ExpertRepack``).

All through llama.cpp's functions (``weight_repack.FUNCTIONS``, resolved from the library
llama-cpp-python loaded); the gates check the result against llama.cpp's own load-time
repack, bit for bit.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import attrs

from bmoe.adapters.llama.ggml_symbols import address, typed
from bmoe.cext import weight_repack
from bmoe.cext.expert_stream import CAPTURE_MUL_MAT, CAPTURE_MUL_MAT_ID

REPACK_BUFT_NAME = "CPU_REPACK"
_DEVICE_TYPE_CPU = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


@attrs.frozen
class CpuRepack:
    """llama.cpp's CPU device and its extra buffer types (``find`` locates them).

    - ``buft``: ``CPU_REPACK``, the one routed experts are repacked into as they are read;
    - ``ahead``: the extra buffer types llama.cpp tries before ``CPU_REPACK`` (``AMX`` on
      Intel CPUs with AMX), offered by this build whether refused or not;
    - ``dense_bufts``: ``(name, buft)`` of the extra buffer types a weight may be placed
      in, in llama.cpp's order, those ``find`` was told to refuse left out: a weight goes to
      the first that computes its op, as llama.cpp's loader places it."""

    device: int
    buft: int
    ahead: tuple[str, ...] = ()
    dense_bufts: tuple[tuple[str, int], ...] = ()

    @classmethod
    def find(cls, refuse: Collection[str] = ()) -> CpuRepack | None:
        """The CPU device's ``CPU_REPACK`` buffer type and those before it (``refuse``:
        names never to place a weight in), or None where this build of llama.cpp has no
        ``CPU_REPACK`` (then weights stay in the file's layout, as with ``--no-repack``)."""
        try:
            weight_repack.bind({name: address(name) for name in weight_repack.FUNCTIONS})
        except (AttributeError, KeyError):
            return None
        found = extra_buffer_types()
        if found is None:
            return None
        device, bufts = found
        ahead: list[str] = []
        for name, buft in bufts:
            if name == REPACK_BUFT_NAME:
                usable = tuple((n, b) for n, b in bufts if n not in refuse)
                return cls(device=device, buft=buft, ahead=tuple(ahead), dense_bufts=usable)
            ahead.append(name)
        return None

    def wants(self, tensor: int, uses: int, n_expert_used: int) -> bool:
        """Whether llama.cpp would repack this weight into ``CPU_REPACK``: read only as the
        matrix of a ``mul_mat`` (or, routed experts, a ``mul_mat_id``), and the CPU device
        runs that op on it from a ``CPU_REPACK`` buffer."""
        return self._computes(tensor, uses, n_expert_used, self.buft)

    def place(self, tensor: int, uses: int, n_expert_used: int) -> tuple[str, int] | None:
        """``(name, buft)`` of the first of ``dense_bufts`` whose kernels compute this
        weight's op (llama.cpp's loader's choice, refused types left out); None: it stays
        in the file's layout."""
        for name, buft in self.dense_bufts:
            if self._computes(tensor, uses, n_expert_used, buft):
                return name, buft
        return None

    def _computes(self, tensor: int, uses: int, n_expert_used: int, buft: int) -> bool:
        if uses == CAPTURE_MUL_MAT:
            return weight_repack.supported(tensor, weight_repack.OP_MUL_MAT, 0, buft, self.device)
        if uses == CAPTURE_MUL_MAT_ID:
            return weight_repack.supported(
                tensor, weight_repack.OP_MUL_MAT_ID, max(1, n_expert_used), buft, self.device
            )
        return False


def extra_buffer_types() -> tuple[int, list[tuple[str, int]]] | None:
    """The CPU device and its extra buffer types ``(name, buft)`` in llama.cpp's order (the
    order its loader tries them), or None where this build has none to offer."""
    try:
        by_type = typed("ggml_backend_dev_by_type", ctypes.c_void_p, ctypes.c_int)
        reg_of = typed("ggml_backend_dev_backend_reg", ctypes.c_void_p, ctypes.c_void_p)
        proc = typed("ggml_backend_reg_get_proc_address", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
        name_of = typed("ggml_backend_buft_name", ctypes.c_char_p, ctypes.c_void_p)
    except (AttributeError, KeyError):
        return None
    device = by_type(_DEVICE_TYPE_CPU)
    if not device:
        return None
    get_extra = proc(reg_of(device), b"ggml_backend_dev_get_extra_bufts")
    if not get_extra:
        return None
    extra_bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(get_extra)(device)
    out: list[tuple[str, int]] = []
    i = 0
    while extra_bufts and extra_bufts[i]:
        out.append((bytes(name_of(extra_bufts[i]) or b"").decode(), int(extra_bufts[i])))
        i += 1
    return int(device), out


def offered_buffer_types() -> tuple[str, ...]:
    """The names of the CPU's extra buffer types this llama.cpp offers (``AMX``,
    ``CPU_REPACK``, ...), in its order."""
    found = extra_buffer_types()
    return tuple(name for name, _ in found[1]) if found is not None else ()


class DenseRepack:
    """Dense weights moved into one buffer per extra buffer type (llama.cpp allocates and
    fills them: ``CPU_REPACK`` repacks, ``AMX`` converts); freed by ``close``, after the
    model."""

    def __init__(
        self,
        placed: Mapping[int, Sequence[int]],
        moved: Callable[[int, int], object] | None = None,
        names: Mapping[int, str] | None = None,
    ) -> None:
        """``placed``: buft -> the tensors to move into a buffer of it; ``moved(address,
        nbytes)``: called after each tensor with the memory it no longer reads (the streamer
        gives its pages back at once: the dense part is never held twice); ``names``: buft
        -> its name, for ``by_type``."""
        self.n_tensors = sum(len(t) for t in placed.values())
        self.by_type: dict[str, int] = {}  # buffer type name -> bytes placed in it
        self._buffers: list[int] = []
        for buft, tensors in placed.items():
            if not tensors:
                continue
            n_bytes = weight_repack.aligned_size(buft, list(tensors))
            buffer = weight_repack.alloc_buffer(buft, n_bytes)
            self._buffers.append(buffer)
            weight_repack.move_to_buffer(buffer, buft, list(tensors), moved)
            name = (names or {}).get(buft, str(buft))
            self.by_type[name] = self.by_type.get(name, 0) + n_bytes
        self.n_bytes = sum(self.by_type.values())

    def close(self) -> None:
        while self._buffers:
            weight_repack.free_buffer(self._buffers.pop())


class ExpertRepack:
    """Routed-expert tensors computed by the repacked kernels: each tagged with a
    ``CPU_REPACK`` buffer (which holds none of their bytes: they stay in the streamer's
    memory) and given a template of one expert's shape for the lanes. ``close`` frees the
    buffer and the templates, after the model (the tensors point at the buffer until then)."""

    def __init__(self, repack: CpuRepack, tensors: Iterable[int]) -> None:
        tensors = list(tensors)
        self._tag = weight_repack.alloc_buffer(repack.buft, 64)
        self._templates: weight_repack.Templates | None = weight_repack.Templates(max(1, len(tensors)))
        self.templates: dict[int, int] = {}  # tensor address -> its template (0: not repacked)
        for tensor in tensors:
            template = self._templates.add(tensor, self._tag)
            self.templates[tensor] = template if template and weight_repack.tag(tensor, self._tag) else 0
        self.tensor_set = weight_repack.tensor_set_address()

    def close(self) -> None:
        self._templates = None
        weight_repack.free_buffer(self._tag)
        self._tag = 0


def buffer_type_name(tensor: int) -> str:
    """The name of the buffer type a weight lives in (``CPU``, ``CPU_REPACK``, ...; ``""``
    for none)."""
    buffer = weight_repack.tensor_info(tensor)["buffer"]
    if not buffer:
        return ""
    get_type = typed("ggml_backend_buffer_get_type", ctypes.c_void_p, ctypes.c_void_p)
    name_of = typed("ggml_backend_buft_name", ctypes.c_char_p, ctypes.c_void_p)
    return bytes(name_of(get_type(buffer)) or b"").decode()
