"""The routers the decode routing policies evaluate (docs/read-ahead.md).

Per MoE layer: the router's rows (``blk.L.ffn_gate_inp.weight``, ``[n_embd, n_expert]`` in
ggml order: row ``e`` is expert ``e``'s ``n_embd`` weights), its bias where the model has one
(gpt-oss: ``ffn_gate_inp.bias``) and the selection bias (DeepSeek-V3 style:
``exp_probs_b.bias``). F32 tensors are used where they lie (the dense weights' copy in
anonymous memory); other types get a dequantized F32 copy (``gguf.quants``) kept alive here.
The gating function is the file's ``<arch>.expert_gating_func`` where it says one, else
llama.cpp's default for the architecture.
"""

from __future__ import annotations

import ctypes

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from bmoe.adapters.gguf_layout import ModelLayout, TensorLocation, read_header_values
from bmoe.cext import expert_stream

GGML_F32 = 0
SOFTMAX, SIGMOID, SOFTMAX_WEIGHT, SQRT_SOFTPLUS = 1, 2, 3, 4
_DEFAULT_GATING = {"gpt-oss": SOFTMAX_WEIGHT}


def gating_function(layout: ModelLayout, arch: str) -> int:
    """llama.cpp's expert gating function for this model (1..4)."""
    key = f"{arch}.expert_gating_func"
    value = read_header_values(layout.paths[0], [key]).get(key)
    if isinstance(value, int) and value in (SOFTMAX, SIGMOID, SOFTMAX_WEIGHT, SQRT_SOFTPLUS):
        return value
    return _DEFAULT_GATING.get(arch, SOFTMAX)


class RouterGates:
    """Declares every MoE layer's router to the streamer; holds the F32 copies it made."""

    def __init__(self) -> None:
        self._copies: list[np.ndarray] = []

    def _f32(self, loc: TensorLocation, address: int) -> int:
        """The address of ``loc``'s values as contiguous F32."""
        if loc.ggml_type == GGML_F32:
            return address
        raw = np.frombuffer(ctypes.string_at(address, loc.n_bytes), dtype=np.uint8)
        values = np.ascontiguousarray(dequantize(raw, GGMLQuantizationType(loc.ggml_type)), dtype=np.float32)
        self._copies.append(values)
        return int(values.ctypes.data)

    def attach(
        self,
        streamer: expert_stream.ExpertStreamer,
        layout: ModelLayout,
        bases: dict[int, int],
        moe_layers: list[int],
        *,
        arch: str,
        n_expert: int,
        n_expert_used: int,
    ) -> bool:
        """Declare the routers; False (nothing declared) when the model's routers are not
        where or what the policies need (they then stay off, and the caller says so)."""
        found: list[tuple[int, int, int, int]] = []
        n_embd = 0
        for layer in moe_layers:
            w = layout.tensors.get(f"blk.{layer}.ffn_gate_inp.weight")
            if w is None or len(w.shape) != 2 or w.shape[1] != n_expert or w.file_index not in bases:
                return False
            if n_embd and w.shape[0] != n_embd:
                return False
            n_embd = w.shape[0]
            addresses = []
            for name in (f"blk.{layer}.ffn_gate_inp.bias", f"blk.{layer}.exp_probs_b.bias"):
                loc = layout.tensors.get(name)
                if loc is None:
                    addresses.append(0)
                elif loc.shape != (n_expert,) or loc.file_index not in bases:
                    return False
                else:
                    addresses.append(self._f32(loc, bases[loc.file_index] + loc.offset))
            found.append((layer, self._f32(w, bases[w.file_index] + w.offset), addresses[0], addresses[1]))
        if not found:
            return False
        streamer.set_router(n_embd, n_expert_used, gating_function(layout, arch))
        for layer, weights, bias, selection_bias in found:
            streamer.set_gate(layer, weights, bias, selection_bias)
        return True
