"""What the bench runs: the configurations, their cache budgets, the order of the rounds.

Pure: no I/O. A budget is given in MiB (``1536``), as a share of the model's routed experts
(``25%``), or ``0`` (streaming with the cache off).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

MIB = 1024 * 1024

KINDS = ("stock", "stock-norepack", "resident", "stream")
"""``stock``: llama-cpp-python's own classes, mmap, its defaults (weight repacking on,
flash attention off); ``stock-norepack``: the same with repacking off; ``resident``: bmoe
without streaming; ``stream``: bmoe streaming, once per cache budget."""

ROUTING_PROBE_PERCENT = 25.0
"""The budget (share of the experts) whose cache hit rate says whether the routing moves."""


class BenchConfigError(ValueError):
    """A bench argument that cannot be used (the message says which and why)."""


@attrs.frozen
class Budget:
    """A cache budget: ``mib`` MiB, ``percent`` % of the routed experts' bytes, or ``auto``
    (``--cache-mb auto``, the default: the session sizes it from the memory room)."""

    mib: int | None = None
    percent: float | None = None
    auto: bool = False

    def __attrs_post_init__(self) -> None:
        if self.auto and (self.mib is not None or self.percent is not None):
            raise BenchConfigError("an auto budget has no size of its own")
        if not self.auto and (self.mib is None) == (self.percent is None):
            raise BenchConfigError("a budget is either MiB or a percentage of the experts")
        if self.mib is not None and self.mib < 0:
            raise BenchConfigError(f"a budget cannot be negative ({self.mib} MiB)")
        if self.percent is not None and not 0 < self.percent <= 100:
            raise BenchConfigError(f"a budget percentage must be in (0, 100], not {self.percent}")

    def resolve_mib(self, expert_bytes: int) -> int:
        """The budget in MiB for a model whose routed experts take ``expert_bytes`` (an auto
        budget has none before the session reads its room: ``BenchConfigError``)."""
        if self.auto:
            raise BenchConfigError("an auto budget is chosen by the session: it has no size here")
        if self.mib is not None:
            return self.mib
        assert self.percent is not None
        return max(1, round(expert_bytes * self.percent / 100 / MIB))


def parse_budget(text: str) -> Budget:
    """``"1536"`` -> 1536 MiB, ``"25%"`` -> a quarter of the experts, ``"0"`` -> cache off,
    ``"auto"`` -> the session's own choice from the memory room (the default)."""
    s = text.strip()
    if s == "auto":
        return Budget(auto=True)
    try:
        if s.endswith("%"):
            return Budget(percent=float(s[:-1]))
        return Budget(mib=int(s))
    except ValueError as exc:
        if isinstance(exc, BenchConfigError):
            raise
        raise BenchConfigError(
            f"a budget is MiB (1536), a share of the experts (25%) or auto, not {text!r}"
        ) from None


def parse_budgets(text: str) -> list[Budget]:
    return [parse_budget(part) for part in text.split(",") if part.strip()]


def parse_kinds(text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise BenchConfigError(f"unknown configuration {', '.join(unknown)}: choose from {', '.join(KINDS)}")
    if not kinds:
        raise BenchConfigError("no configuration to run")
    return list(dict.fromkeys(kinds))


PREDICT: Mapping[str, object] = {"predict_prefetch": True}
POLICY_FLAGS: dict[str, tuple[str, type | None, str, Mapping[str, object]]] = {
    "prefetch": ("prefetch", int, "--prefetch", {}),
    "predict": ("predict_prefetch", None, "--predict-prefetch", {}),
    "predict-auto": ("predict_auto", None, "--predict-prefetch auto", PREDICT),
    "predict-spec": ("predict_spec_max", int, "--predict-prefetch --predict-spec-max", PREDICT),
    "predict-depth": ("predict_depth", int, "--predict-prefetch --predict-depth", PREDICT),
    "route-ahead": ("route_ahead", int, "--route-ahead", {}),
    "drop": ("drop_cold", float, "--drop-cold-experts", {}),
    "substitute": ("substitute", float, "--expert-substitute", {}),
    "slru": ("", None, "--cache-policy slru", {"eviction": "slru"}),
    "lfu": ("", None, "--cache-policy lfu", {"eviction": "lfu"}),
    "lfu-half": ("half_life", int, "--cache-policy lfu --cache-half-life", {"eviction": "lfu"}),
    "lru": ("", None, "--cache-policy lru", {"eviction": "lru"}),
    "adaptive": ("", None, "--cache-policy adaptive", {"eviction": "adaptive"}),
    "no-store": ("", None, "--expert-store off", {"expert_store": "off"}),
    "layer-victims": ("", None, "--cache-victims layer", {"victims": "layer"}),
    "global-victims": ("", None, "--cache-victims global", {"victims": "global"}),
    "auto-victims": ("", None, "--cache-victims auto", {"victims": "auto"}),
}
"""The decode routing policies the bench can run beside each cache budget: name ->
(``StreamConfig`` field, value type (None: a switch), the CLI flag, the other fields the
policy needs set; a switch without a field only sets those)."""
CACHE_RULES = frozenset(
    {"slru", "lfu", "lfu-half", "lru", "adaptive", "no-store", "layer-victims", "global-victims"}
    | {"auto-victims"}
)
"""The entries of ``POLICY_FLAGS`` that choose the cache's eviction or where the experts are
read from (``no-store``: the model file, where an expert store would serve), not a routing
policy: they run with several sequences too."""


@attrs.frozen
class Policy:
    """One decode routing policy, e.g. ``route-ahead=2`` (docs/read-ahead.md)."""

    name: str
    value: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.name not in POLICY_FLAGS:
            raise BenchConfigError(f"unknown policy {self.name!r}: choose from {', '.join(POLICY_FLAGS)}")
        kind = POLICY_FLAGS[self.name][1]
        if (kind is None) != (self.value is None):
            raise BenchConfigError(
                f"policy {self.name} takes {'no value' if kind is None else 'a value (name=value)'}"
            )
        if self.value is not None and self.value < 0:
            raise BenchConfigError(f"policy {self.name} needs a value >= 0")

    def stream_kwargs(self) -> dict[str, object]:
        field, kind, _, implied = POLICY_FLAGS[self.name]
        if kind is None:
            return {**implied, field: True} if field else dict(implied)
        assert self.value is not None
        return {**implied, field: kind(self.value)}

    @property
    def key(self) -> str:
        return self.name if self.value is None else f"{self.name}{self.value:g}"

    @property
    def flag(self) -> str:
        flag = POLICY_FLAGS[self.name][2]
        return flag if self.value is None else f"{flag} {self.value:g}"


def parse_policies(text: str) -> tuple[Policy, ...]:
    """``"prefetch=1,predict,route-ahead=2"`` -> the policies to run beside each budget."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, value = part.partition("=")
        try:
            out.append(Policy(name.strip(), float(value) if value.strip() else None))
        except ValueError as exc:
            if isinstance(exc, BenchConfigError):
                raise
            raise BenchConfigError(f"a policy is name or name=value, not {part!r}") from None
    return tuple(dict.fromkeys(out))


@attrs.frozen
class BenchConfig:
    """One configuration: ``key`` names it in the JSON, ``label`` in the report."""

    key: str
    label: str
    kind: str
    cache_mib: int | None = None
    expert_percent: float | None = None  # the budget as a share of the experts
    policy: Policy | None = None  # a decode routing policy (streaming with a cache only)
    parallel: int | None = None  # sequences per decode step (--parallel); None: one, the plain bench
    base_key: str = ""  # the key without the sequence count ("" : the key itself)

    def stream_kwargs(self) -> dict[str, object]:
        return {} if self.policy is None else self.policy.stream_kwargs()

    @property
    def plain_key(self) -> str:
        """The configuration's key whatever its sequence count (``resident`` for ``resident-np4``)."""
        return self.base_key or self.key

    @property
    def is_stock(self) -> bool:
        return self.kind.startswith("stock")

    @property
    def streams(self) -> bool:
        return self.kind == "stream"


def build_configs(
    kinds: list[str],
    budgets: list[Budget],
    expert_bytes: int,
    prefetch: tuple[int, ...] = (),
    policies: tuple[Policy, ...] = (),
    routing_check: bool = True,
) -> list[BenchConfig]:
    """The configurations in run order: stock ones first, then bmoe resident, then streaming
    by increasing budget. Streaming includes the routing probe's budget (25% of the
    experts) unless ``routing_check`` is off, and each budget (in MiB) runs once, then once
    more per ``prefetch`` depth and per decode routing policy (budgets with a cache only, and
    not the probe's where only the probe asked for it). An ``auto`` budget runs first among
    them (``stream-auto``), with the same policies."""
    extra = tuple(dict.fromkeys([*(Policy("prefetch", float(k)) for k in prefetch), *policies]))
    out: list[BenchConfig] = []
    labels = {
        "stock": "stock llama-cpp-python (mmap, its defaults: repacking on)",
        "stock-norepack": "stock llama-cpp-python (mmap, repacking off)",
        "resident": "bmoe resident",
    }
    for kind in ("stock", "stock-norepack", "resident"):
        if kind in kinds:
            out.append(BenchConfig(key=kind, label=labels[kind], kind=kind))
    if "stream" in kinds and any(b.auto for b in budgets):
        auto = BenchConfig(
            key="stream-auto",
            label="bmoe stream, cache auto (the default: sized from the memory room)",
            kind="stream",
        )
        out += _with_policies(auto, "cache auto", extra)
    if "stream" in kinds:
        asked = {b.resolve_mib(expert_bytes) for b in budgets if not b.auto}
        probe = {Budget(percent=ROUTING_PROBE_PERCENT).resolve_mib(expert_bytes)} if routing_check else set()
        mibs = sorted(asked | probe)
        for mib in mibs:
            share = 100 * mib * MIB / expert_bytes if expert_bytes else None
            what = "cache off" if mib == 0 else f"cache {mib} MiB"
            if mib and share is not None:
                what += f" ({share:.0f}% of the experts)"
            base = BenchConfig(
                key=f"stream-{mib}",
                label=f"bmoe stream, {what}",
                kind="stream",
                cache_mib=mib,
                expert_percent=share,
            )
            out += _with_policies(base, what, extra if mib and mib in asked else ())
    return out


def _with_policies(base: BenchConfig, what: str, policies: tuple[Policy, ...]) -> list[BenchConfig]:
    """A streamed configuration, then the same once per decode routing policy (``what``: its
    cache, as the policies' labels name it)."""
    return [base] + [
        attrs.evolve(
            base, key=f"{base.key}-{policy.key}", label=f"bmoe stream, {what}, {policy.flag}", policy=policy
        )
        for policy in policies
    ]


def parse_prefetch(text: str) -> tuple[int, ...]:
    """``"1,2"`` -> (1, 2): the ``--prefetch`` depths to run beside each cache budget."""
    try:
        depths = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BenchConfigError(f"--prefetch takes depths like 1,2, not {text!r}") from None
    if any(k < 1 for k in depths):
        raise BenchConfigError("--prefetch depths must be >= 1")
    return tuple(dict.fromkeys(depths))


def routing_probe(configs: list[BenchConfig], expert_bytes: int) -> BenchConfig | None:
    """The streaming configuration whose budget is the probe's (25% of the experts)."""
    mib = Budget(percent=ROUTING_PROBE_PERCENT).resolve_mib(expert_bytes)
    return next((c for c in configs if c.streams and c.cache_mib == mib), None)


def interleave(configs: list[BenchConfig], rounds: int) -> list[tuple[int, BenchConfig]]:
    """(round, configuration) in run order: A, B, C, A, B, C, ... so drift hits all alike."""
    if rounds < 1:
        raise BenchConfigError(f"rounds must be >= 1, not {rounds}")
    return [(r, c) for r in range(rounds) for c in configs]


MAX_PARALLEL = 64
"""The most sequences ``--parallel`` runs in one decode step."""


def parse_parallel(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> (1, 2, 4, 8): the sequence counts ``--parallel`` runs each configuration at."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BenchConfigError(f"--parallel takes sequence counts like 1,2,4,8, not {text!r}") from None
    if not counts or any(not 1 <= n <= MAX_PARALLEL for n in counts):
        raise BenchConfigError(f"--parallel counts must be between 1 and {MAX_PARALLEL}, not {text!r}")
    return tuple(sorted(set(counts)))


def with_parallel(configs: list[BenchConfig], counts: tuple[int, ...]) -> list[BenchConfig]:
    """Each configuration once per sequence count, counts innermost (``resident-np1``,
    ``resident-np2``, ...). Decode routing policies are refused with several sequences (the
    session refuses them too)."""
    with_policy = [c.key for c in configs if c.policy is not None and c.policy.name not in CACHE_RULES]
    if with_policy and max(counts) > 1:
        raise BenchConfigError(
            f"--parallel above 1 does not combine with decode routing policies ({', '.join(with_policy)})"
        )
    return [
        attrs.evolve(
            c,
            key=f"{c.key}-np{n}",
            label=f"{c.label}, {n} sequence{'s' if n > 1 else ''}",
            parallel=n,
            base_key=c.key,
        )
        for c in configs
        for n in counts
    ]


def sequence_texts(tokens: list[int], sequences: int, widest: int, fed: int) -> list[list[int]]:
    """The first ``sequences`` of ``widest`` texts cut from ``tokens``, ``fed`` tokens each,
    starting evenly spread over it (sequence 0 at its start): a sequence's text is the same
    whatever the count, so counts compare the same conversations."""
    if not 1 <= sequences <= widest:
        raise BenchConfigError(f"{sequences} sequences asked of {widest}")
    room = len(tokens) - fed
    stride = room // (widest - 1) if widest > 1 else 0
    if room < 0 or (widest > 1 and stride < 1):
        raise BenchConfigError(
            f"the text's {len(tokens)} tokens cannot give {widest} sequences of {fed} tokens "
            "that start apart: lower --prompt-tokens, --warmup or --tokens"
        )
    return [tokens[s * stride : s * stride + fed] for s in range(sequences)]
