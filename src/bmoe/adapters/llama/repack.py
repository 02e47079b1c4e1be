"""Weights in llama.cpp's repacked layout (``CPU_REPACK``) for a model loaded without it.

Stock llama.cpp repacks at load (``use_extra_bufts``): every weight whose matmul its CPU
backend has a repacked kernel for is copied into a ``CPU_REPACK`` buffer, interleaved for
the SIMD kernels. That copies the whole model into anonymous memory, which streaming
cannot afford, so a streamed model is loaded with repacking off and repacked here, weight
by weight, exactly as llama.cpp decides and does it:

- which weights: those llama.cpp's loader would place in ``CPU_REPACK`` (the op each feeds,
  as the capture decode saw it, tested on the CPU device with a stand-in in that buffer
  type: ``weight_repack.supported``);
- dense weights move into one ``CPU_REPACK`` buffer (allocated and filled by llama.cpp);
- routed-expert tensors keep the streamer's memory, get the buffer type's traits, and
  each expert is repacked by llama.cpp as a lane reads it (``ExpertRepack``).

All through llama.cpp's functions (``weight_repack.FUNCTIONS``, resolved from the library
llama-cpp-python loaded); the gates check the result against llama.cpp's own load-time
repack, bit for bit.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable

import attrs

from bmoe.adapters.llama.ggml_symbols import address, typed
from bmoe.cext import weight_repack
from bmoe.cext.expert_stream import CAPTURE_MUL_MAT, CAPTURE_MUL_MAT_ID

REPACK_BUFT_NAME = b"CPU_REPACK"
_DEVICE_TYPE_CPU = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


@attrs.frozen
class CpuRepack:
    """llama.cpp's CPU device and its ``CPU_REPACK`` buffer type (``find`` locates them).

    ``ahead``: the CPU's extra buffer types llama.cpp tries before ``CPU_REPACK`` (``AMX`` on
    Intel CPUs with AMX): a weight one of them takes is not repacked into ``CPU_REPACK`` at
    load, and bmoe reproduces only ``CPU_REPACK``'s choices."""

    device: int
    buft: int
    ahead: tuple[str, ...] = ()

    @classmethod
    def find(cls) -> CpuRepack | None:
        """The CPU device's ``CPU_REPACK`` buffer type, or None where this build of llama.cpp
        has none (then weights stay in the file's layout, as with ``--no-repack``)."""
        try:
            weight_repack.bind({name: address(name) for name in weight_repack.FUNCTIONS})
            by_type = typed("ggml_backend_dev_by_type", ctypes.c_void_p, ctypes.c_int)
            reg_of = typed("ggml_backend_dev_backend_reg", ctypes.c_void_p, ctypes.c_void_p)
            proc = typed(
                "ggml_backend_reg_get_proc_address", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p
            )
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
        i = 0
        ahead: list[str] = []
        while extra_bufts and extra_bufts[i]:
            name = name_of(extra_bufts[i])
            if name == REPACK_BUFT_NAME:
                return cls(device=int(device), buft=int(extra_bufts[i]), ahead=tuple(ahead))
            ahead.append(bytes(name or b"").decode())
            i += 1
        return None

    def wants(self, tensor: int, uses: int, n_expert_used: int) -> bool:
        """Whether llama.cpp would repack this weight: read only as the matrix of a
        ``mul_mat`` (or, routed experts, a ``mul_mat_id``), and the CPU device runs that op
        on it from a ``CPU_REPACK`` buffer."""
        if uses == CAPTURE_MUL_MAT:
            return weight_repack.supported(tensor, weight_repack.OP_MUL_MAT, 0, self.buft, self.device)
        if uses == CAPTURE_MUL_MAT_ID:
            return weight_repack.supported(
                tensor, weight_repack.OP_MUL_MAT_ID, max(1, n_expert_used), self.buft, self.device
            )
        return False


class DenseRepack:
    """Dense weights moved into one ``CPU_REPACK`` buffer (freed by ``close``, after the model)."""

    def __init__(
        self, repack: CpuRepack, tensors: list[int], moved: Callable[[int, int], object] | None = None
    ) -> None:
        """``moved(address, nbytes)``: called after each tensor with the memory it no longer
        reads (the streamer gives its pages back at once: the dense part is never held twice)."""
        self.n_tensors = len(tensors)
        self.n_bytes = weight_repack.aligned_size(repack.buft, tensors) if tensors else 0
        self._buffer = 0
        if tensors:
            self._buffer = weight_repack.alloc_buffer(repack.buft, self.n_bytes)
            weight_repack.move_to_buffer(self._buffer, repack.buft, tensors, moved)

    def close(self) -> None:
        weight_repack.free_buffer(self._buffer)
        self._buffer = 0


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
