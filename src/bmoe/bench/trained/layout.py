"""The trained model's shape and its weights: a flat mapping of GGUF tensor names to arrays.

One representation serves every part: the numpy initialisation, the torch parameters (the
same names), the GGUF export and both forward passes. Shapes are numpy order, the reverse
of ggml's ``ne`` (a ggml ``{n_in, n_out}`` matrix is ``(n_out, n_in)`` here), exactly as
llama.cpp's ``qwen3moe`` loads them: the experts are 3-D ``(n_expert, rows, cols)``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np
import numpy.typing as npt
from gguf import MODEL_TENSOR

from bmoe.tinymodel.archs.common import tensor_name
from bmoe.tinymodel.spec import MoeDims
from bmoe.tinymodel.tokenizer import build_vocab

F32 = npt.NDArray[np.float32]
Weights = Mapping[str, F32]
"""GGUF tensor name to its float32 values, numpy order."""


def _tokenizer_vocab_size() -> int:
    return build_vocab().size


@attrs.frozen
class TrainedDims:
    """Shapes of a ``qwen3moe`` model with the tiny models' byte-level vocabulary."""

    n_layer: int = 6
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 32
    n_expert_used: int = 4
    n_ff_exp: int = 128
    n_ctx: int = 256
    rms_eps: float = 1e-6
    rope_base: float = 10_000.0
    n_vocab: int = attrs.field(factory=_tokenizer_vocab_size)

    def __attrs_post_init__(self) -> None:
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs), not {self.head_dim}")
        if not 1 <= self.n_expert_used <= self.n_expert:
            raise ValueError(f"need 1 <= n_expert_used <= n_expert, got {self.n_expert_used}/{self.n_expert}")

    def moe_dims(self) -> MoeDims:
        """The tiny models' hyper-parameter record (what their GGUF writer writes as keys)."""
        return MoeDims(
            n_layer=self.n_layer,
            n_embd=self.n_embd,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            head_dim=self.head_dim,
            n_expert=self.n_expert,
            n_expert_used=self.n_expert_used,
            n_ff_exp=self.n_ff_exp,
            n_ctx_train=self.n_ctx,
            rms_eps=self.rms_eps,
            rope_freq_base=self.rope_base,
        )


@attrs.frozen
class LayerNames:
    """The GGUF names of one layer's tensors."""

    attn_norm: str
    wq: str
    wk: str
    wv: str
    wo: str
    q_norm: str
    k_norm: str
    ffn_norm: str
    router: str
    gate_exps: str
    up_exps: str
    down_exps: str


def layer_names(il: int) -> LayerNames:
    """Names of layer ``il``'s tensors (``blk.IL.*.weight``)."""

    def n(kind: MODEL_TENSOR) -> str:
        return tensor_name(kind, il)

    return LayerNames(
        attn_norm=n(MODEL_TENSOR.ATTN_NORM),
        wq=n(MODEL_TENSOR.ATTN_Q),
        wk=n(MODEL_TENSOR.ATTN_K),
        wv=n(MODEL_TENSOR.ATTN_V),
        wo=n(MODEL_TENSOR.ATTN_OUT),
        q_norm=n(MODEL_TENSOR.ATTN_Q_NORM),
        k_norm=n(MODEL_TENSOR.ATTN_K_NORM),
        ffn_norm=n(MODEL_TENSOR.FFN_NORM),
        router=n(MODEL_TENSOR.FFN_GATE_INP),
        gate_exps=n(MODEL_TENSOR.FFN_GATE_EXP),
        up_exps=n(MODEL_TENSOR.FFN_UP_EXP),
        down_exps=n(MODEL_TENSOR.FFN_DOWN_EXP),
    )


TOKEN_EMBD = tensor_name(MODEL_TENSOR.TOKEN_EMBD)
OUTPUT_NORM = tensor_name(MODEL_TENSOR.OUTPUT_NORM)
OUTPUT = tensor_name(MODEL_TENSOR.OUTPUT)


def expected_shapes(dims: TrainedDims) -> dict[str, tuple[int, ...]]:
    """Every tensor's numpy shape, in file order (embedding, layers, output norm, head)."""
    e, d, x, f = dims.n_embd, dims.head_dim, dims.n_expert, dims.n_ff_exp
    q, kv = dims.n_head * d, dims.n_head_kv * d
    shapes: dict[str, tuple[int, ...]] = {TOKEN_EMBD: (dims.n_vocab, e)}
    for il in range(dims.n_layer):
        n = layer_names(il)
        shapes |= {
            n.attn_norm: (e,),
            n.wq: (q, e),
            n.wk: (kv, e),
            n.wv: (kv, e),
            n.wo: (e, q),
            n.q_norm: (d,),
            n.k_norm: (d,),
            n.ffn_norm: (e,),
            n.router: (x, e),
            n.gate_exps: (x, f, e),
            n.up_exps: (x, f, e),
            n.down_exps: (x, e, f),
        }
    shapes |= {OUTPUT_NORM: (e,), OUTPUT: (dims.n_vocab, e)}
    return shapes


def check_weights(dims: TrainedDims, weights: Weights) -> None:
    """``ValueError`` naming the first missing, extra or misshapen tensor."""
    shapes = expected_shapes(dims)
    extra = sorted(set(weights) - set(shapes))
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]!r}")
    for name, shape in shapes.items():
        if name not in weights:
            raise ValueError(f"missing tensor {name!r}")
        got = weights[name]
        if got.shape != shape or got.dtype != np.float32:
            raise ValueError(f"{name}: expected float32 {shape}, got {got.dtype} {got.shape}")


def routers(dims: TrainedDims, weights: Weights) -> F32:
    """Every layer's router (``ffn_gate_inp``) stacked, ``[n_layer, n_expert, n_embd]``."""
    return np.stack([weights[layer_names(il).router] for il in range(dims.n_layer)]).astype(np.float32)
