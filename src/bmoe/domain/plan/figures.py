"""What the planner knows of a model (from its GGUF header alone) and of this machine.

``ModelFigures`` holds sizes, not weights: the dense part, the routed experts, one expert
(one cache entry: every projection of one expert of the largest layer), one token's working
set (every MoE layer's top-k experts: below it an LRU cache cycles and hits almost never),
the KV cache per token and an estimate of llama.cpp's compute buffer per prompt token.
``MachineFigures`` holds the memory room, the disk's read speed at the expert-read size and
the compute rates a short matmul measured here.
"""

from __future__ import annotations

import attrs

from bmoe.domain.memory_room import MemoryRoom
from bmoe.domain.plan.prompt_rates import PromptRates, curve_at

MIB = 1024 * 1024
F32 = 4


@attrs.frozen
class ModelFigures:
    """A model's sizes in bytes, from its header (``python -m bmoe.plan``)."""

    name: str  # the file (or the first shard) as the user named it
    arch: str
    file_bytes: int  # every shard
    n_layer: int
    moe_layers: tuple[int, ...]  # the layers with routed experts
    n_expert: int
    n_expert_used: int
    expert_bytes: int  # every routed expert of every layer
    entry_bytes: int  # one expert of the largest layer, every projection: one cache entry
    layer_bytes: int  # the largest layer's experts
    token_cycle_bytes: int  # every MoE layer's k experts: one token's working set
    read_bytes: int  # one read of the streamer: one expert's slice of one projection
    kv_bytes_per_token: int  # the KV cache per context token (f16, every sequence together)
    n_embd: int
    n_vocab: int
    n_head: int
    n_ff_exp: int  # one expert's hidden width
    n_ctx_train: int
    bytes_per_weight: float  # of the routed experts (the quantization)
    head_dim: int = 0  # attention's key width a head (0: unknown, no attention term)
    n_attn_layers: int = 0  # layers with attention (a KV cache)
    # the token embedding table where the output head is a tensor of its own (a token reads a row)
    embedding_bytes: int = 0
    prompt_weights: int = 0  # weights a prompt token multiplies by (``model_figures``; 0: unknown)

    def attention_flops(self, tokens: int, batch: int) -> float:
        """The attention scores' FLOPs of a prompt of ``tokens`` in batches of ``batch``: each
        batch's queries against every KV cell so far (QK^T and the weighted sum of V: 4 x
        heads x head width a query and cell), in every attention layer. Quadratic in the
        prompt: 1.1 TFLOP for 2,048 tokens of a 16-layer, 32-head, 128-wide model."""
        if self.head_dim <= 0 or self.n_attn_layers <= 0 or tokens <= 0:
            return 0.0
        batch = max(1, min(batch, tokens))
        pairs = sum(
            min(batch, tokens - start) * min(tokens, start + batch) for start in range(0, tokens, batch)
        )
        return 4.0 * self.n_head * self.head_dim * self.n_attn_layers * pairs

    @property
    def n_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def dense_bytes(self) -> int:
        """Everything that is not a routed expert (attention, norms, routers, shared
        experts, embeddings, output head, the header)."""
        return max(0, self.file_bytes - self.expert_bytes)

    @property
    def active_bytes(self) -> int:
        """Weight bytes one decode step computes with: the dense part (less the embedding
        table, of which a token reads one row) and one token's working set."""
        return self.dense_bytes - self.embedding_bytes + self.token_cycle_bytes

    @property
    def prompt_token_weights(self) -> float:
        """The weights a prompt token multiplies by (``prompt_weights``; where unknown, the
        active bytes over the experts' bytes a weight)."""
        if self.prompt_weights > 0:
            return float(self.prompt_weights)
        return self.active_bytes / max(self.bytes_per_weight, 1e-9)

    def cache_share(self, budget_bytes: int) -> float:
        """The share of every routed expert a cache of ``budget_bytes`` holds (0 where the
        experts' size is unknown)."""
        return budget_bytes / self.expert_bytes if self.expert_bytes > 0 else 0.0

    def kv_bytes(self, n_ctx: int) -> int:
        return self.kv_bytes_per_token * n_ctx

    def compute_per_token(self, n_ctx: int, flash_attn: bool = False) -> float:
        """An estimate of llama.cpp's compute buffer per ubatch token (bytes). Its graph is
        reserved for a ubatch whose every token has an output row, and ggml's allocator
        reuses memory between the graph's stages, so the buffer is its largest stage's, in
        f32: the logits (``n_vocab`` a token), the experts' hidden activations (``3 k
        n_ff_exp`` and ``k n_embd``), or, without flash attention, the attention scores and
        mask (``(n_head + 1) n_ctx``). Against llama.cpp's probe contexts: the built-in model
        within 60% above (tests/gates/test_plan_gates.py), the 5.6 GB bench model and the trained one
        within 3% of the figures ``bmoe.domain.streaming.prefill_memory`` quotes."""
        f = self.n_embd
        logits = self.n_vocab + f
        experts = 3 * self.n_expert_used * self.n_ff_exp + self.n_expert_used * f + 6 * f
        attention = 0 if flash_attn else (self.n_head + 1) * n_ctx + 6 * f
        return float(F32 * max(logits, experts, attention))


@attrs.frozen
class StreamCosts:
    """Seconds a MiB read adds beyond its read (``bmoe.runtime.stream_calibration``): to a
    decode step, to a prompt; ``source``: how they were had."""

    decode_s_per_mib: float
    prefill_s_per_mib: float
    source: str


@attrs.frozen
class MachineFigures:
    """This machine as the plan sees it.

    ``room``: the memory room as ``--cache-mb auto`` reads it (``--mem-limit-mb`` replaces
    it); ``disk_mib_s``: ``O_DIRECT`` reads at the expert-read size, ``disk_source`` how it
    was had (``measured on FILE``, ``--disk-mib-s``); ``matvec_bytes_s``: weight bytes a
    matrix-vector product streams a second here (the decode's compute bound),
    ``matmul_flops``: a matrix product's FLOP/s (the prefill's); ``cores``: what the process
    may run on; ``free_disk_bytes``: free space where the model file is or would go (None
    where unknown)."""

    room: MemoryRoom
    disk_mib_s: float
    disk_source: str
    matvec_bytes_s: float
    matmul_flops: float
    cores: int
    free_disk_bytes: int | None = None
    room_source: str = ""  # "--mem-limit-mb 2048" where the user set it
    compute_source: str = ""  # how the compute rates were had (llama.cpp's kernels timed here)
    # the prefill's FLOP/s by the tokens each expert of a prompt batch computes on (ascending)
    matmul_curve: tuple[tuple[float, float], ...] = ()
    stream_costs: StreamCosts | None = None  # None: not measured here
    attention_flops_s: float = 0.0  # a prompt's attention scores' FLOP/s here (0: not measured)
    # the calibration's fastest and slowest tries over its medians, widened to this machine's
    # calibrations of two weeks: how far its compute moves (the prefill's range carries it)
    compute_spread: tuple[float, float] = (1.0, 1.0)
    # this machine's recent calibrations' prompt rates (``compute_spread.recent_rates``): the
    # prefill's range spans the prompt counted at each of them
    recent_rates: tuple[PromptRates, ...] = ()

    def matmul_flops_at(self, tokens_per_expert: float) -> float:
        """The prefill's FLOP/s where each expert computes on ``tokens_per_expert`` tokens:
        the measured curve, a straight line between its points, its ends beyond them
        (``matmul_flops`` where there is no curve)."""
        return curve_at(self.matmul_curve, tokens_per_expert, self.matmul_flops)

    @property
    def prompt_rates(self) -> PromptRates:
        """Today's calibration's prompt rates."""
        return PromptRates(self.matmul_curve, self.attention_flops_s)
