"""A big random ``qwen3moe`` GGUF for benchmarks (never for exactness gates).

The defaults are the Qwen3-30B-like shape of ``references.md`` (16 layers, 2048 hidden,
768 expert width, 128 experts, top-8, Q4_0: about 5.6 GB). The tokenizer, chat template and
hyper-parameter keys are the tiny fixtures' own (:mod:`bmoe.tinymodel`), so the
model tokenizes and chats like them; only the shapes and the weight format differ.

The file is written tensor by tensor: the header and tensor infos first (sizes are known
from the shapes), then each tensor's bytes are drawn, written and dropped, so memory stays
at one tensor (the biggest is one ``*_exps`` tensor, ~113 MB at the default shape).

Quantized weights are raw blocks: Q4_0 = an f16 scale then 16 bytes of 4-bit values
(``w = (q - 8) * d``), Q8_0 = an f16 scale then 32 int8 values, Q4_K (a K-quant: 256
values per block) = f16 ``d`` and ``dmin``, 12 bytes of 6-bit sub-block scales and minimums,
128 bytes of 4-bit values; every sub-block gets scale 1 and minimum 8 and ``dmin = d``, so
``w = (q - 8) * d`` as in Q4_0. The nibbles/bytes are
uniform random, made zero-mean (see ``_symmetric_codes``), and the scale of a tensor is
chosen so its weights have RMS ``1/sqrt(fan_in)`` (as the fixtures' ``WeightInit.matrix``):
every projection keeps its input's magnitude and the model stays finite. Norms and the
router are F32 (llama.cpp's quantizer never quantizes ``ffn_gate_inp`` either), embeddings
and LM head are the fixtures' F32 tensors.

Random routers spread tokens almost uniformly over the experts: cache hit rates measured
on such a model are pessimistic compared with a trained one.

Command line::

    python -m bmoe.tinymodel.synthetic --out PATH [--layers 16 --embd 2048 --expert-ff 768
        --experts 128 --top-k 8 --quant q4_0 --seed 0]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
from gguf import MODEL_TENSOR, GGMLQuantizationType, GGUFWriter, LlamaFileType

from bmoe.adapters.file_writes import make_folder
from bmoe.tinymodel.archs.common import add_common_hparams, embedding_and_head, tensor_name
from bmoe.tinymodel.spec import FixtureSpec, MoeDims
from bmoe.tinymodel.tokenizer import build_vocab
from bmoe.tinymodel.weights import WeightInit
from bmoe.tinymodel.writer import add_tokenizer

ARCH = "qwen3moe"
QK = 32  # values per Q4_0 / Q8_0 block
# Q4_K's 12 sub-block bytes for scale 1 and minimum 8 in each of its 8 sub-blocks (llama.cpp's
# packing: bytes 0-3 the low 6 bits of scales 0-3, 4-7 of minimums 0-3, 8-11 the low 4 bits
# of scales and minimums 4-7; their high 2 bits are the top bits of bytes 0-7, zero here)
_Q4_K_SUBBLOCKS = bytes([1, 1, 1, 1, 8, 8, 8, 8, 0x81, 0x81, 0x81, 0x81])


@attrs.frozen
class QuantFormat:
    """One block format: its ggml type, bytes per 32-value block, and the RMS of its codes."""

    name: str
    ggml_type: GGMLQuantizationType
    file_type: LlamaFileType
    block_bytes: int
    code_rms: float  # RMS of the dequantized value for d = 1 and uniform random codes
    block_values: int = QK

    def n_bytes(self, n_values: int) -> int:
        return n_values // self.block_values * self.block_bytes

    @property
    def header_bytes(self) -> int:
        """Bytes before a block's codes: the f16 scale (Q4_K: and dmin, and the sub-blocks)."""
        return 16 if self.ggml_type == GGMLQuantizationType.Q4_K else 2


QUANTS: dict[str, QuantFormat] = {
    # Q4_0: w = (q - 8) d with q in 0..15; the code 0 (w = -8d) is replaced by 8 (w = 0), so the
    # weights are symmetric around 0: -7..7, 0 twice as likely. E[w^2] = 2 * sum(k^2, 1..7) / 16
    "q4_0": QuantFormat("q4_0", GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0, 18, 17.5**0.5),
    # Q8_0: w = q d, q int8 with -128 replaced by 0: E[w^2] = 2 * sum(k^2, 1..127) / 256
    "q8_0": QuantFormat("q8_0", GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0, 34, 5397.5**0.5),
    # Q4_K: w = d * 1 * q - dmin * 8 with dmin = d, the codes as Q4_0's (see _Q4_K_SUBBLOCKS)
    "q4_k": QuantFormat(
        "q4_k", GGMLQuantizationType.Q4_K, LlamaFileType.MOSTLY_Q4_K_M, 144, 17.5**0.5, block_values=256
    ),
}


@attrs.frozen
class SyntheticShape:
    """The model's shape. ``n_head``/``n_head_kv`` default to Qwen3-30B's ratios."""

    n_layer: int = 16
    n_embd: int = 2048
    n_ff_exp: int = 768
    n_expert: int = 128
    n_expert_used: int = 8
    head_dim: int = 128
    n_head: int | None = None  # default: 2 * n_embd / head_dim (Qwen3-30B: 32)
    n_head_kv: int | None = None  # default: n_head / 8 (Qwen3-30B: 4)
    n_ctx_train: int = 4096
    quant: str = "q4_0"

    def __attrs_post_init__(self) -> None:
        if self.quant not in QUANTS:
            raise ValueError(f"quant must be one of {sorted(QUANTS)}, not {self.quant!r}")
        for name in ("n_layer", "n_embd", "n_ff_exp", "n_expert", "n_expert_used", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.n_expert_used > self.n_expert:
            raise ValueError("top-k cannot exceed the number of experts")
        block = self.fmt.block_values
        for name in ("n_embd", "n_ff_exp"):
            if getattr(self, name) % block:
                raise ValueError(f"{name} must be a multiple of {block} ({self.quant} blocks)")
        if (self.heads * self.head_dim) % block:
            raise ValueError(f"n_head * head_dim must be a multiple of {block}")
        if self.heads % self.kv_heads:
            raise ValueError("n_head must be a multiple of n_head_kv")

    @property
    def heads(self) -> int:
        return self.n_head if self.n_head is not None else max(1, 2 * self.n_embd // self.head_dim)

    @property
    def kv_heads(self) -> int:
        return self.n_head_kv if self.n_head_kv is not None else max(1, self.heads // 8)

    @property
    def fmt(self) -> QuantFormat:
        return QUANTS[self.quant]

    def dims(self) -> MoeDims:
        """The fixtures' shape record, for their hyper-parameter writer."""
        return MoeDims(
            n_layer=self.n_layer,
            n_embd=self.n_embd,
            n_head=self.heads,
            n_head_kv=self.kv_heads,
            head_dim=self.head_dim,
            n_expert=self.n_expert,
            n_expert_used=self.n_expert_used,
            n_ff_exp=self.n_ff_exp,
            n_ctx_train=self.n_ctx_train,
        )

    def expert_slice_bytes(self) -> int:
        """Bytes of one expert of one projection (``nb[2]`` of an ``*_exps`` tensor)."""
        return self.fmt.n_bytes(self.n_embd * self.n_ff_exp)

    def expert_bytes(self) -> int:
        """All routed experts, all layers."""
        return self.n_layer * 3 * self.n_expert * self.expert_slice_bytes()

    def token_cycle_bytes(self) -> int:
        """Sum over layers of k experts (3 projections each): what one token reads with no cache."""
        return self.n_layer * 3 * self.n_expert_used * self.expert_slice_bytes()


# -- the tensor plan -------------------------------------------------------------------------

Array = npt.NDArray[np.float32] | npt.NDArray[np.uint8]


@attrs.frozen
class PlannedTensor:
    """A tensor to write: its name, numpy-order shape, ggml type, size and a maker."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    n_bytes: int
    make: Callable[[], Array]


def _rng(seed: int, name: str) -> np.random.Generator:
    """One independent stream per tensor, as the fixtures' ``WeightInit`` draws them."""
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


def quantized_random(
    fmt: QuantFormat, shape: tuple[int, ...], rng: np.random.Generator, target_rms: float
) -> npt.NDArray[np.uint8]:
    """Raw blocks of a random tensor whose weights have RMS ``target_rms`` (one scale per tensor)."""
    n_values = int(np.prod(shape))
    n_blocks = n_values // fmt.block_values
    out = np.empty((n_blocks, fmt.block_bytes), dtype=np.uint8)
    scale = np.float16(target_rms / fmt.code_rms)
    if not np.isfinite(scale) or scale == 0:
        raise ValueError(f"scale {target_rms / fmt.code_rms} is not representable in f16")
    out[:, :2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    if fmt.ggml_type == GGMLQuantizationType.Q4_K:
        out[:, 2:4] = out[:, :2]  # dmin = d
        out[:, 4:16] = np.frombuffer(_Q4_K_SUBBLOCKS, dtype=np.uint8)
    start = fmt.header_bytes
    codes = fmt.block_bytes - start
    raw = np.frombuffer(rng.bytes(n_blocks * codes), dtype=np.uint8).reshape(n_blocks, codes)
    out[:, start:] = _symmetric_codes(fmt, raw)
    return out.reshape(-1)


def _symmetric_codes(fmt: QuantFormat, raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Uniform random codes made zero-mean.

    Plain uniform codes have mean -d/2 (Q4_0: -8..7, Q8_0: -128..127): every matrix would add
    the same offset to all its outputs, the hidden states would share one direction and a
    random router would send every token to the same few experts. Mapping the one unpaired
    code to zero removes the offset.
    """
    if fmt.ggml_type in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_K):
        lo = raw & 0x0F
        hi = raw >> 4
        lo[lo == 0] = 8
        hi[hi == 0] = 8
        return np.asarray(lo | (hi << 4), dtype=np.uint8)
    if fmt.ggml_type == GGMLQuantizationType.Q8_0:
        codes = raw.copy()
        codes[codes == 0x80] = 0  # int8 -128 -> 0
        return codes
    raise ValueError(f"no code rule for {fmt.name}")


def plan_tensors(shape: SyntheticShape, seed: int) -> list[PlannedTensor]:
    """Every tensor of the model in file order (``qwen3moe`` as llama.cpp loads it)."""
    fmt = shape.fmt
    init = WeightInit(seed)
    vocab = build_vocab()
    dims = shape.dims()
    plan: list[PlannedTensor] = []

    def f32(name: str, values: npt.NDArray[np.float32]) -> None:
        values = np.ascontiguousarray(values, dtype=np.float32)
        f32_type = GGMLQuantizationType.F32
        plan.append(PlannedTensor(name, values.shape, f32_type, values.nbytes, lambda: values))

    def lazy_f32(name: str, dims_: tuple[int, ...], make: Callable[[], npt.NDArray[np.float32]]) -> None:
        n_bytes = int(np.prod(dims_)) * 4
        plan.append(PlannedTensor(name, dims_, GGMLQuantizationType.F32, n_bytes, make))

    def quant(name: str, dims_: tuple[int, ...]) -> None:
        fan_in = dims_[-1]

        def make() -> npt.NDArray[np.uint8]:
            return quantized_random(fmt, dims_, _rng(seed, name), 1.0 / fan_in**0.5)

        plan.append(PlannedTensor(name, dims_, fmt.ggml_type, fmt.n_bytes(int(np.prod(dims_))), make))

    # embeddings, output norm, LM head: the fixtures' tensors (muted special/unprintable rows)
    spec = FixtureSpec(name="synthetic", arch=ARCH, dims=dims, description="synthetic benchmark model")
    muted = vocab.special_ids + vocab.unprintable_byte_ids
    for name, values in embedding_and_head(spec, init, vocab.size, muted):
        assert isinstance(values, np.ndarray)  # F32 tensors: never quantized here
        f32(name, values.astype(np.float32))

    q_width = shape.heads * shape.head_dim
    kv_width = shape.kv_heads * shape.head_dim
    e, ff, embd = shape.n_expert, shape.n_ff_exp, shape.n_embd
    for il in range(shape.n_layer):
        f32(tensor_name(MODEL_TENSOR.ATTN_NORM, il), WeightInit.ones((embd,)))
        quant(tensor_name(MODEL_TENSOR.ATTN_Q, il), (q_width, embd))
        quant(tensor_name(MODEL_TENSOR.ATTN_K, il), (kv_width, embd))
        quant(tensor_name(MODEL_TENSOR.ATTN_V, il), (kv_width, embd))
        quant(tensor_name(MODEL_TENSOR.ATTN_OUT, il), (embd, q_width))
        f32(tensor_name(MODEL_TENSOR.ATTN_Q_NORM, il), WeightInit.ones((shape.head_dim,)))
        f32(tensor_name(MODEL_TENSOR.ATTN_K_NORM, il), WeightInit.ones((shape.head_dim,)))
        f32(tensor_name(MODEL_TENSOR.FFN_NORM, il), WeightInit.ones((embd,)))
        router = tensor_name(MODEL_TENSOR.FFN_GATE_INP, il)
        lazy_f32(router, (e, embd), functools.partial(init.matrix, router, (e, embd)))
        quant(tensor_name(MODEL_TENSOR.FFN_GATE_EXP, il), (e, ff, embd))
        quant(tensor_name(MODEL_TENSOR.FFN_UP_EXP, il), (e, ff, embd))
        quant(tensor_name(MODEL_TENSOR.FFN_DOWN_EXP, il), (e, embd, ff))
    return plan


# -- writing ---------------------------------------------------------------------------------


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def write_synthetic(
    out: Path, shape: SyntheticShape | None = None, seed: int = 0, *, progress: bool = True
) -> Path:
    """Write the model to ``out`` (one file) and return ``out``."""
    shape = shape or SyntheticShape()
    if seed < 0:
        raise ValueError("seed must be >= 0")
    out = Path(out)
    make_folder(out.parent, f"the model {out.name}")
    plan = plan_tensors(shape, seed)
    total = sum(t.n_bytes for t in plan)

    writer = GGUFWriter(out, ARCH)
    writer.add_name("bmoe-synthetic-qwen3moe")
    writer.add_description(
        f"random {shape.quant.upper()} qwen3moe for benchmarks: {shape.n_layer} layers, "
        f"{shape.n_embd} hidden, {shape.n_ff_exp} expert width, {shape.n_expert} experts, "
        f"top-{shape.n_expert_used}, seed {seed}"
    )
    writer.add_file_type(shape.fmt.file_type)
    writer.add_quantization_version(2)
    writer.add_string("bmoe.synthetic.quant", shape.quant)
    writer.add_uint32("bmoe.synthetic.seed", seed)
    add_tokenizer(writer, build_vocab())
    add_common_hparams(writer, shape.dims())
    for t in plan:
        # a non-uint8 dtype keeps the element shape as given (gguf treats uint8 as a byte shape)
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.n_bytes, raw_dtype=t.ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    t0 = time.perf_counter()
    done = 0
    last_report = 0.0
    try:
        for i, t in enumerate(plan):
            data = t.make()
            if data.nbytes != t.n_bytes:
                raise AssertionError(f"{t.name}: made {data.nbytes} bytes, planned {t.n_bytes}")
            writer.write_tensor_data(data)
            done += t.n_bytes
            del data
            now = time.perf_counter()
            if progress and (now - last_report >= 1.0 or i == len(plan) - 1):
                last_report = now
                rate = done / max(now - t0, 1e-9)
                print(
                    f"\rsynthetic: {_fmt_bytes(done)} / {_fmt_bytes(total)} "
                    f"({100 * done / total:5.1f}%, {_fmt_bytes(rate)}/s, tensor {i + 1}/{len(plan)})",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
        writer.flush()
    finally:
        writer.close()
    if progress:
        print(f"\nsynthetic: wrote {out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def _parser() -> argparse.ArgumentParser:
    d = SyntheticShape()
    p = argparse.ArgumentParser(
        prog="python -m bmoe.tinymodel.synthetic",
        description=(
            "Write a big random qwen3moe GGUF for benchmarks (deterministic from the seed). "
            "Defaults: the Qwen3-30B-like shape, about 5.6 GB."
        ),
    )
    p.add_argument("--out", type=Path, required=True, metavar="PATH", help="the .gguf file to write")
    p.add_argument("--layers", type=int, default=d.n_layer)
    p.add_argument("--embd", type=int, default=d.n_embd, help="hidden width")
    p.add_argument("--expert-ff", type=int, default=d.n_ff_exp, help="expert width")
    p.add_argument("--experts", type=int, default=d.n_expert)
    p.add_argument("--top-k", type=int, default=d.n_expert_used)
    p.add_argument("--head-dim", type=int, default=d.head_dim)
    p.add_argument("--heads", type=int, default=None, help="default: 2 * embd / head-dim")
    p.add_argument("--kv-heads", type=int, default=None, help="default: heads / 8")
    p.add_argument("--ctx-train", type=int, default=d.n_ctx_train)
    p.add_argument("--quant", choices=sorted(QUANTS), default=d.quant)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the sizes and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    try:
        shape = SyntheticShape(
            n_layer=a.layers,
            n_embd=a.embd,
            n_ff_exp=a.expert_ff,
            n_expert=a.experts,
            n_expert_used=a.top_k,
            head_dim=a.head_dim,
            n_head=a.heads,
            n_head_kv=a.kv_heads,
            n_ctx_train=a.ctx_train,
            quant=a.quant,
        )
    except ValueError as exc:
        p.error(str(exc))
    plan = plan_tensors(shape, a.seed)
    total = sum(t.n_bytes for t in plan)
    print(
        f"synthetic: {len(plan)} tensors, {_fmt_bytes(total)} "
        f"(experts {_fmt_bytes(shape.expert_bytes())}, dense {_fmt_bytes(total - shape.expert_bytes())}, "
        f"token cycle {_fmt_bytes(shape.token_cycle_bytes())})",
        file=sys.stderr,
    )
    if a.dry_run:
        return 0
    write_synthetic(a.out, shape, a.seed)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
