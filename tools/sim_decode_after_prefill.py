"""Replay ``--route-trace`` CSVs offline through bmoe's own cache policy, to separate why decode
hits less after a long prompt than after a short one (issue 11).

    python tools/sim_decode_after_prefill.py --short rt20.csv --long rt2000.csv --cache-mb 1296
    python tools/sim_decode_after_prefill.py --compare rt20_s*.csv rt2000_s*.csv --cache-mb 648 1296
    python tools/sim_decode_after_prefill.py --compare rt*.csv --cache-share 0.25 0.5

A trace's layer calls (rows sharing turn, phase, step, layer, in file order) are fed to
``ExpertCachePolicy.request(layer, experts, n_tokens)`` exactly as the fast engine does (the
experts of the rows not dropped, ``n_tokens`` the ubatch's routed tokens), followed, like the
engine's ``prefill_ahead`` (on by default), by a whole-layer read ahead of the next MoE layer
after a prefill call that routed at least half the experts (``ExpertCachePolicy.prefetch``).
The budget is ``--cache-mb`` MiB and each layer's entry size is the trace's ``expert_bytes``
(the engine's ``ExpertCachePolicy(budget, sizes, n_expert)``). Routing does not depend on the
cache (streaming is exact), so a trace is the model's routing and can be replayed under any
cache state or prefill rule.

It reports:
  1. validation: the replay's per-slot hit/miss against the trace's ``residency`` column;
  2. scenarios: each run's decode replayed from the state its own prefill left, from an empty
     cache, from the other run's prefill state, from ideal warm starts, and Belady's MIN, over
     all decode steps and over the last half (steady state);
  3. routing concentration: distinct experts per layer in decode, overlap of decode's experts
     with the last N prompt tokens', and the decode slots a per-layer static set could cover;
  4. alternative prefill rules (the hot set of a prefill call), simulator only.

``--compare`` instead replays each trace's decode, from the state its own prefill left, at each
budget (``--cache-mb``, or ``--cache-share``: a fraction of all the routed-expert bytes) three
ways: plain LRU (``replacement_sim``'s model of bmoe's policy before its segmented LRU), the
segmented LRU as simulated here (``slru_sim``; ``--protected``: its protected segment's share
of the budget, 90% unless told), and bmoe's own ``ExpertCachePolicy`` as installed (the
segmented LRU whose protected segment is the budget less one token cycle: it follows the SLRU
column at that share, except that an entry the prefill read ahead and no prompt token used
is not promoted by its first decode use); then the means per prompt length.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bmoe.domain.streaming import ExpertCachePolicy
from bmoe.domain.streaming.cache_policy import Entry, LayerPlan
from bmoe.domain.streaming.prefetch import next_moe_layer, prefill_reads_ahead

# -- the trace -------------------------------------------------------------------------------


@dataclass
class Call:
    """One MoE layer call: its routed experts (token order, repeats) and per-token selections."""

    phase: str
    step: int
    layer: int
    tokens: list[list[int]]  # per token of the ubatch (token index order), its non-dropped experts
    token_ids: list[int]  # each token's index within the ubatch
    residency: list[int]  # per row, as traced (0 miss, 1 hit, 2 hit on a read ahead)
    row_experts: list[int]

    @property
    def experts(self) -> list[int]:
        return [e for t in self.tokens for e in t]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass
class Trace:
    calls: list[Call]
    entry_bytes: list[int]
    n_expert: int
    top_k: int
    ubatch: int
    n_prompt: int = 0

    def prefill(self) -> list[Call]:
        return [c for c in self.calls if c.phase == "prefill"]

    def decode(self) -> list[Call]:
        return [c for c in self.calls if c.phase == "decode"]

    def prompt_routing(self) -> dict[int, list[tuple[int, list[int]]]]:
        """Per layer: (absolute prompt position, experts) of every prefill token routed there."""
        out: dict[int, list[tuple[int, list[int]]]] = {}
        for c in self.prefill():
            for tid, exps in zip(c.token_ids, c.tokens, strict=True):
                out.setdefault(c.layer, []).append((c.step * self.ubatch + tid, exps))
        return out


def load_trace(path: str, n_layer: int | None = None, ubatch: int = 512, decode_steps: int = 0) -> Trace:
    """``decode_steps`` > 0: keep only the first that many decode steps (a longer run with the
    same seed routes its first steps exactly as a shorter one)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if decode_steps > 0:
        rows = [r for r in rows if r["phase"] != "decode" or int(r["step"]) < decode_steps]
    if len({r["turn"] for r in rows}) != 1:
        raise SystemExit(f"{path}: one-turn traces only")
    groups: OrderedDict[tuple[str, str, str], list[dict[str, str]]] = OrderedDict()
    for r in rows:
        groups.setdefault((r["phase"], r["step"], r["layer"]), []).append(r)
    top_k = max(len(v) for (ph, _, _), v in groups.items() if ph == "decode")
    n_layer = n_layer or max(int(r["layer"]) for r in rows) + 1
    sizes = [0] * n_layer
    for r in rows:
        sizes[int(r["layer"])] = int(r["expert_bytes"])
    calls = []
    for (phase, step, layer), v in groups.items():
        per: OrderedDict[int, list[int]] = OrderedDict()
        for r in v:
            tok = int(r["slot"]) // top_k
            per.setdefault(tok, [])
            if r["dropped"] == "0":
                per[tok].append(int(r["expert"]))
        calls.append(
            Call(
                phase,
                int(step),
                int(layer),
                list(per.values()),
                list(per.keys()),
                [int(r["residency"]) for r in v],
                [int(r["expert"]) for r in v],
            )
        )
    n_expert = 1 << max(int(r["expert"]) for r in rows).bit_length()  # power of two in practice
    t = Trace(calls, sizes, n_expert, top_k, ubatch)
    pr = t.prompt_routing()
    t.n_prompt = 1 + max(pos for layer in pr.values() for pos, _ in layer)
    return t


# -- prefill rules (the hot set of a prefill call) -------------------------------------------

# A rule gets (policy, layer, ids in first-routed order, per-token experts) and returns
# (hot ids, order): ``order`` None keeps the policy's own order (hot hits touched in wanted
# order, then the loads in wanted order), else the hot ids are touched in that order (last =
# most recent). What is not hot: its hits stay where they are, its loads enter cold.
Hot = tuple[Sequence[int], Sequence[int] | None]
Rule = Callable[["RulePolicy", int, list[int], list[list[int]]], Hot]


def rule_share(p: RulePolicy, layer: int, ids: list[int], tokens: list[list[int]]) -> Hot:
    """bmoe's rule: above the share, the top-share most-routed (ties: first routed) stay hot."""
    share = p.share(layer)
    if len(ids) <= share:
        return ids, None
    counts = Counter(e for t in tokens for e in t)
    ranked = sorted(range(len(ids)), key=lambda i: (-counts[ids[i]], i))
    return [ids[i] for i in ranked[:share]], None


def rule_lru(p: RulePolicy, layer: int, ids: list[int], tokens: list[list[int]]) -> Hot:
    return ids, None


def rule_cold(p: RulePolicy, layer: int, ids: list[int], tokens: list[list[int]]) -> Hot:
    """Above the share, nothing a prefill routes is made hot."""
    return (ids, None) if len(ids) <= p.share(layer) else ([], None)


def rule_last(k: int, cap_share: bool = True) -> Rule:
    """Above the share, the experts of the last ``k`` tokens stay hot (at most share, the
    latest token's first), touched so the last token's are the most recent."""

    def rule(p: RulePolicy, layer: int, ids: list[int], tokens: list[list[int]]) -> Hot:
        share = p.share(layer)
        if len(ids) <= share:
            return ids, None
        order: list[int] = []  # most recent first
        for t in reversed(tokens[-k:]):
            for e in t:
                if e not in order:
                    order.append(e)
        if cap_share:
            order = order[:share]
        return order, list(reversed(order))

    rule.__name__ = f"last{k}" + ("" if cap_share else "-nocap")
    return rule


def rule_recency(half_life: float) -> Rule:
    """Above the share, the top-share by a recency-weighted count (each routing weighs
    0.5 ** (tokens after it / half_life)) stay hot, the highest score most recent."""

    def rule(p: RulePolicy, layer: int, ids: list[int], tokens: list[list[int]]) -> Hot:
        share = p.share(layer)
        if len(ids) <= share:
            return ids, None
        n = len(tokens)
        score: Counter[int] = Counter()
        for i, t in enumerate(tokens):
            w = 0.5 ** ((n - 1 - i) / half_life)
            for e in t:
                score[e] += w
        ranked = sorted(ids, key=lambda e: (-score[e], ids.index(e)))[:share]
        return ranked, list(reversed(ranked))

    rule.__name__ = f"recency{half_life:g}"
    return rule


def rule_share_then_last(k: int) -> Rule:
    """Above the share: the last ``k`` tokens' experts, then the most-routed, up to share hot;
    touched so the most-routed are older and the last tokens' the most recent."""

    def rule(p: RulePolicy, layer: int, ids: list[int], tokens: list[list[int]]) -> Hot:
        share = p.share(layer)
        if len(ids) <= share:
            return ids, None
        recent: list[int] = []
        for t in reversed(tokens[-k:]):
            for e in t:
                if e not in recent:
                    recent.append(e)
        recent = recent[:share]
        counts = Counter(e for t in tokens for e in t)
        rest = sorted((e for e in ids if e not in recent), key=lambda e: (-counts[e], ids.index(e)))
        rest = rest[: share - len(recent)]
        order = list(reversed(rest)) + list(reversed(recent))
        return order, order

    rule.__name__ = f"share+last{k}"
    return rule


class RulePolicy(ExpertCachePolicy):
    """``ExpertCachePolicy`` with the prefill hot set chosen by ``rule``; decode (one token)
    unchanged. ``rule_share`` is checked to reproduce the base class decision for decision."""

    def __init__(self, budget: int, sizes: Sequence[int], n_expert: int, rule: Rule) -> None:
        super().__init__(budget, sizes, n_expert)
        self.rule = rule

    def request_tokens(self, layer: int, tokens: list[list[int]]) -> LayerPlan:
        routed = [e for t in tokens for e in t]
        if len(tokens) == 1:
            return super().request(layer, routed, 1)
        ids = self._checked_ids(layer, routed)
        size = self.entry_bytes[layer]
        wanted = [(layer, e) for e in ids]
        hot_ids, order = self.rule(self, layer, ids, tokens)
        hot = {(layer, e) for e in hot_ids}
        hits = tuple(e for e in wanted if self.is_resident(e))
        loads = tuple(e for e in wanted if not self.is_resident(e))
        adopted = tuple(e for e in hits if e in self._prefetched)
        self._prefetched.difference_update(adopted)
        self._protected = frozenset(wanted)
        evictions = self._evict_until(len(loads) * size, keep=frozenset(wanted)) if loads else ()
        if loads:
            self._last_request_bytes = len(wanted) * size
        for entry in loads:
            if entry in self._evicted_once:
                self.counters.rereads += 1
            self._probation[entry] = None
        self.resident_bytes += len(loads) * size
        if order is None:  # the base class's order: hot hits touched, then loads appended
            for entry in hits:
                if entry in hot:
                    self._touch(entry)
            for entry in loads:
                self._probation.move_to_end(entry)
        else:  # the rule's order, last the most recent (each in its segment)
            for e in order:
                self._touch((layer, e))
        for entry in loads:  # cold loads to the cold end one by one, as the base class does
            if entry not in hot:
                self._probation.move_to_end(entry, last=False)
        c = self.counters
        c.requests += 1
        c.hits += len(hits)
        c.misses += len(loads)
        c.bytes_read += len(loads) * size
        c.prefetch_hits += len(adopted)
        return LayerPlan(layer=layer, hits=hits, evictions=evictions, loads=loads, adopted=adopted)


# -- replay ----------------------------------------------------------------------------------


@dataclass
class Tally:
    hits: list[int] = field(default_factory=list)  # per decode step
    slots: list[int] = field(default_factory=list)

    def rate(self, start: int = 0) -> float:
        s = sum(self.slots[start:])
        return 100.0 * sum(self.hits[start:]) / s if s else float("nan")


class Engine:
    """The fast engine's decisions on top of a policy: request, then the prefill read ahead."""

    def __init__(self, policy: ExpertCachePolicy, prefill_ahead: bool = True) -> None:
        self.policy = policy
        self.prefill_ahead = prefill_ahead

    def call(self, c: Call) -> LayerPlan:
        p = self.policy
        if isinstance(p, RulePolicy):
            plan = p.request_tokens(c.layer, c.tokens)
        else:
            plan = p.request(c.layer, c.experts, c.n_tokens)
        n_routed = len(set(c.experts))
        if self.prefill_ahead and prefill_reads_ahead(c.n_tokens, n_routed, p.n_expert):
            ahead = next_moe_layer(c.layer, p.entry_bytes)
            if ahead is not None:
                p.prefetch(ahead, list(range(p.n_expert)))
        return plan

    def run(self, calls: Sequence[Call], tally: Tally | None = None) -> None:
        for c in calls:
            plan = self.call(c)
            if tally is not None and c.phase == "decode":
                while len(tally.hits) <= c.step:
                    tally.hits.append(0)
                    tally.slots.append(0)
                tally.hits[c.step] += sum(1 for e in c.experts if (c.layer, e) in set(plan.hits))
                tally.slots[c.step] += len(c.experts)


def make_policy(budget: int, t: Trace, rule: Rule | None = None) -> ExpertCachePolicy:
    if rule is None:
        return ExpertCachePolicy(budget, t.entry_bytes, t.n_expert)
    return RulePolicy(budget, t.entry_bytes, t.n_expert, rule)


def preload(p: ExpertCachePolicy, entries_oldest_first: Sequence[Entry]) -> None:
    """Put entries in the cache (free), oldest first; counters untouched."""
    for entry in entries_oldest_first:
        if p.is_resident(entry):
            p._touch(entry)
            continue
        size = p.entry_bytes[entry[0]]
        if p.resident_bytes + size > p.budget_bytes:
            break
        p._probation[entry] = None
        p.resident_bytes += size
        p.counters.misses += 1  # keeps check_valid's accounting (misses - evictions = resident)


def belady(decode: Sequence[Call], capacity: int, initial: Sequence[Entry] = ()) -> Tally:
    """Belady's MIN (evict the entry used farthest in the future; equal sizes) over decode."""
    seq = [(c.step, [(c.layer, e) for e in dict.fromkeys(c.experts)]) for c in decode]
    nxt: dict[Entry, list[int]] = {}
    for i, (_, es) in enumerate(seq):
        for e in es:
            nxt.setdefault(e, []).append(i)
    ptr: Counter[Entry] = Counter()
    cache: set[Entry] = set(list(initial)[:capacity])
    tally = Tally()
    for step, es in seq:
        while len(tally.hits) <= step:
            tally.hits.append(0)
            tally.slots.append(0)
        for e in es:
            ptr[e] += 1  # consumes use i
        for e in es:
            if e in cache:
                tally.hits[step] += 1
            else:
                if len(cache) >= capacity:

                    def future(x: Entry) -> float:
                        uses = nxt.get(x, [])
                        return uses[ptr[x]] if ptr[x] < len(uses) else math.inf

                    victim = max((x for x in cache if x not in es), key=future)
                    cache.discard(victim)
                cache.add(e)
            tally.slots[step] += 1
    return tally


# -- decode replacement (beyond prefill rules) -----------------------------------------------


def replacement_sim(
    t: Trace, budget: int, victim_key: str, start: str = "own", half_life: float = 16.0, steps: int = 24
) -> Tally:
    """Replay ``t``'s decode with another replacement rule, from the resident set bmoe's prefill
    (share rule, read ahead) left (``start`` "own") or from empty. ``victim_key``: "lru" (the
    policy's own before its segmented LRU), "lru2" (evict the entry whose second-to-last use is
    oldest; one used once only, or only before decode, goes first, LRU among those), or "lfu"
    (a use counts 1, decaying by half every ``half_life`` decode tokens; the lowest goes
    first). A decode request is one use per entry; its entries are never evicted to serve it.
    Equal entry sizes."""
    cap = budget // max(t.entry_bytes)
    init: list[Entry] = []
    if start == "own":
        p = make_policy(budget, t)
        Engine(p).run(t.prefill())
        init = p.resident()
    lam = math.log(2) / half_life
    # per entry: (second-to-last use, last use, decayed score, time of score); uses are ticks
    # (one per entry use, in the engine's order: a request's hits, then its loads), the score's
    # time is the decode step; the prefill state's entries come first, in their LRU order
    meta: dict[Entry, tuple[float, float, float, float]] = {}
    tick = 0.0
    for e in init:
        tick += 1
        meta[e] = (-math.inf, tick, 1.0, -1.0)
    tally = Tally()
    for c in t.decode():
        now = float(c.step)
        while len(tally.hits) <= c.step:
            tally.hits.append(0)
            tally.slots.append(0)
        wanted = list(dict.fromkeys((c.layer, e) for e in c.experts))
        keep = set(wanted)
        hits = [e for e in wanted if e in meta]
        misses = [e for e in wanted if e not in meta]
        room = cap - len(meta)
        if len(misses) > room:
            cands = [e for e in meta if e not in keep]

            def key(e: Entry, now: float = now) -> tuple[float, ...]:
                prev, last, score, ts = meta[e]
                if victim_key == "lru":
                    return (last,)
                if victim_key == "lru2":
                    return (prev, last)
                return (score * math.exp(-lam * (now - ts)), last)

            cands.sort(key=key)
            for e in cands[: len(misses) - room]:
                del meta[e]
        for e in hits + misses:
            tick += 1
            old = meta.get(e)
            if old is None:
                meta[e] = (-math.inf, tick, 1.0, now)
            else:
                meta[e] = (old[1], tick, old[2] * math.exp(-lam * (now - old[3])) + 1.0, now)
        tally.hits[c.step] += sum(1 for e in c.experts if (c.layer, e) in set(hits))
        tally.slots[c.step] += len(c.experts)
    return tally


def slru_sim(t: Trace, budget: int, protected_frac: float, start: str = "own") -> Tally:
    """Segmented LRU over decode: an entry enters probation; a decode hit moves it to the
    protected segment's MRU end; a protected segment over ``protected_frac`` of the capacity
    demotes its LRU entry to probation's MRU end; a miss evicts probation's LRU entry (the
    protected segment's when probation holds only the request's own). The prefill state's
    entries start in probation, in the LRU order bmoe's prefill left. Equal entry sizes."""
    cap = budget // max(t.entry_bytes)
    pcap = int(protected_frac * cap)
    prob: OrderedDict[Entry, None] = OrderedDict()  # LRU first
    prot: OrderedDict[Entry, None] = OrderedDict()
    if start == "own":
        p = make_policy(budget, t)
        Engine(p).run(t.prefill())
        for e in p.resident():
            prob[e] = None
    tally = Tally()
    for c in t.decode():
        while len(tally.hits) <= c.step:
            tally.hits.append(0)
            tally.slots.append(0)
        wanted = list(dict.fromkeys((c.layer, e) for e in c.experts))
        keep = set(wanted)
        hits = [e for e in wanted if e in prob or e in prot]
        misses = [e for e in wanted if e not in prob and e not in prot]
        for _ in range(len(prob) + len(prot) + len(misses) - cap):
            victim = next((e for e in prob if e not in keep), None)
            if victim is not None:
                del prob[victim]
            else:
                victim = next(e for e in prot if e not in keep)
                del prot[victim]
        for e in hits:
            prob.pop(e, None)
            prot[e] = None
            prot.move_to_end(e)
        while len(prot) > pcap:
            demoted, _ = prot.popitem(last=False)
            prob[demoted] = None
        for e in misses:
            prob[e] = None
        tally.hits[c.step] += sum(1 for e in c.experts if (c.layer, e) in set(hits))
        tally.slots[c.step] += len(c.experts)
    return tally


# -- reports ---------------------------------------------------------------------------------


def validate(name: str, t: Trace, budget: int) -> str:
    p = make_policy(budget, t)
    eng = Engine(p)
    agree = total = 0
    dec_hits = dec_slots = 0
    for c in t.calls:
        plan = eng.call(c)
        hits = {e for _, e in plan.hits}
        for e, res in zip(c.row_experts, c.residency, strict=True):
            total += 1
            agree += (res != 0) == (e in hits)
        if c.phase == "decode":
            dec_hits += sum(1 for res in c.residency if res)
            dec_slots += len(c.residency)
    p.check_valid()
    # the rule-driven copy of the policy must decide exactly as the policy does
    q = make_policy(budget, t, rule_share)
    Engine(q).run(t.calls)
    same = q.resident() == p.resident() and q.counters == p.counters
    k = p.counters
    n_steps = 1 + max(x.step for x in t.decode())
    return (
        f"{name}: {t.n_prompt} prompt tokens, {n_steps} decode steps; traced decode hit"
        f" {100 * dec_hits / dec_slots:.1f}%; replay agrees on"
        f" {agree}/{total} slots; replay counters: requests {k.requests}, hits {k.hits}, misses"
        f" {k.misses}, evictions {k.evictions}, re-reads {k.rereads}, read ahead {k.prefetch_issued}"
        f" ({k.prefetch_hits} used, {k.prefetch_wasted} wasted); rule copy identical: {same}"
    )


def decode_from(
    t: Trace,
    budget: int,
    start: str,
    other: Trace | None = None,
    rule: Rule | None = None,
    prefill_ahead: bool = True,
) -> Tally:
    """Replay ``t``'s decode from a starting state:
    own (t's prefill), empty, other (``other``'s prefill), self-warm (t's decode run once before),
    oracle-global / oracle-layer (preloaded with decode's most-used entries, globally / top-share
    per layer)."""
    p = make_policy(budget, t, rule)
    eng = Engine(p, prefill_ahead)
    dec = t.decode()
    if start == "own":
        eng.run(t.prefill())
    elif start == "other":
        assert other is not None
        eng.run(other.prefill())
    elif start == "self-warm":
        eng.run(dec)
    elif start in ("oracle-global", "oracle-layer"):
        counts = Counter((c.layer, e) for c in dec for e in c.experts)
        cap = budget // max(t.entry_bytes)
        if start == "oracle-global":
            top = [e for e, _ in counts.most_common(cap)]
        else:
            share = p.share(next(i for i, s in enumerate(t.entry_bytes) if s))
            top = []
            for layer in sorted({c.layer for c in dec}):
                mine = sorted(((n, e) for e, n in counts.items() if e[0] == layer), reverse=True)
                top += [e for _, e in mine[:share]]
            top.sort(key=lambda e: -counts[e])
        preload(p, list(reversed(top)))
    elif start != "empty":
        raise ValueError(start)
    tally = Tally()
    eng.run(dec, tally)
    return tally


def concentration(t: Trace, budget: int) -> list[str]:
    dec = t.decode()
    share = budget // max(t.entry_bytes) // sum(1 for s in t.entry_bytes if s)
    layers = sorted({c.layer for c in dec})
    pr = t.prompt_routing()
    out = []
    distinct = {layer: len({e for c in dec if c.layer == layer for e in c.experts}) for layer in layers}
    out.append(
        f"  distinct experts per layer over {len(dec) // len(layers)} decode steps: mean "
        f"{sum(distinct.values()) / len(layers):.1f} (of {t.n_expert}; per layer "
        + " ".join(str(distinct[la]) for la in layers)
        + ")"
    )
    slots = sum(len(c.experts) for c in dec)
    cov = 0
    for layer in layers:
        cnt = Counter(e for c in dec if c.layer == layer for e in c.experts)
        cov += sum(n for _, n in cnt.most_common(share))
    out.append(
        f"  decode slots covered by each layer's own top-{share} decode experts (static ideal): "
        f"{100 * cov / slots:.1f}%"
    )
    moe_layers = [la for la in layers if la in pr]
    for n_last in (1, 4, 16, 64, 256, 512, 10**9):
        covered = tot = 0
        for c in dec:
            if c.layer not in pr:
                continue
            toks = pr[c.layer]
            recent = {e for pos, exps in toks if pos >= t.n_prompt - n_last for e in exps}
            covered += sum(1 for e in c.experts if e in recent)
            tot += len(c.experts)
        label = "all" if n_last >= 10**9 else str(n_last)
        out.append(
            f"  decode slots whose expert the last {label:>4} prompt tokens routed at that layer: "
            f"{100 * covered / tot:.1f}%  (layers {len(moe_layers)}; the last layer of a prompt "
            "routes only its last token)"
        )
    for n_last in (16, 512, 10**9):
        covered = tot = 0
        for c in dec:
            if c.layer not in pr:
                continue
            cnt = Counter(e for pos, exps in pr[c.layer] if pos >= t.n_prompt - n_last for e in exps)
            top = {e for e, _ in cnt.most_common(share)}
            covered += sum(1 for e in c.experts if e in top)
            tot += len(c.experts)
        label = "all" if n_last >= 10**9 else str(n_last)
        out.append(
            f"  decode slots in the top-{share} most-routed of the last {label:>4} prompt tokens: "
            f"{100 * covered / tot:.1f}%"
        )
    return out


RULES: dict[str, Rule] = {
    "share (bmoe now)": rule_share,
    "lru (no scan resistance)": rule_lru,
    "cold (prefill all cold)": rule_cold,
    **{f"last{k}": rule_last(k) for k in (1, 2, 4, 8, 16, 64)},
    **{f"recency{h:g}": rule_recency(h) for h in (8, 32, 128)},
    **{f"share+last{k}": rule_share_then_last(k) for k in (1, 4)},
}


def compare(
    paths: Sequence[str],
    budgets: Sequence[tuple[str, Callable[[Trace], int]]],
    decode_steps: int,
    ubatch: int,
    tail: int,
    protected: Sequence[float] = (0.9,),
) -> None:
    """Decode hit % per trace and budget: LRU, SLRU (simulated, each protected share), the
    installed policy."""
    traces = [(path, load_trace(path, ubatch=ubatch, decode_steps=decode_steps)) for path in paths]
    kinds = ("LRU", *(f"SLRU {f * 100:g}% (sim)" for f in protected), "ExpertCachePolicy")
    print(
        f"decode hit % over the first {decode_steps or 'all'} decode steps (tail: the last {tail}), "
        "decode from each run's own prefill state"
    )
    for label, budget_of in budgets:
        print(f"\n## budget {label}")
        print("| trace | prompt tokens | entries | " + " | ".join(kinds) + " | tails |")
        print("| --- | ---: | ---: |" + " ---: |" * (len(kinds) + 1))
        groups: dict[int, list[list[float]]] = {}
        for path, t in traces:
            budget = budget_of(t)
            tallies = (
                replacement_sim(t, budget, "lru"),
                *(slru_sim(t, budget, f) for f in protected),
                decode_from(t, budget, "own"),
            )
            start = max(0, len(tallies[0].slots) - tail)
            rates = [x.rate() for x in tallies]
            tails = [x.rate(start) for x in tallies]
            groups.setdefault(t.n_prompt, []).append(rates + tails)
            print(
                f"| {path} | {t.n_prompt} | {budget // max(t.entry_bytes)} | "
                + " | ".join(f"{r:.1f}" for r in rates)
                + " | "
                + " / ".join(f"{r:.1f}" for r in tails)
                + " |"
            )
        print("\n| prompt tokens | runs | " + " | ".join(f"mean {k}" for k in kinds) + " | mean tails |")
        print("| ---: | ---: |" + " ---: |" * (len(kinds) + 1))
        for n_prompt, rows in sorted(groups.items()):
            means = [sum(col) / len(rows) for col in zip(*rows, strict=True)]
            print(
                f"| {n_prompt} | {len(rows)} | "
                + " | ".join(f"{m:.1f}" for m in means[: len(kinds)])
                + " | "
                + " / ".join(f"{m:.1f}" for m in means[len(kinds) :])
                + " |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--compare", nargs="+", metavar="TRACE", help="LRU vs SLRU vs the policy, per trace and budget"
    )
    ap.add_argument("--short", nargs="+", help="route trace(s) of the short-prompt run(s)")
    ap.add_argument(
        "--long",
        nargs="+",
        help="route trace(s) of the long-prompt run(s), "
        "paired with --short in order (the full report is for the first pair; more pairs "
        "add a summary over pairs)",
    )
    ap.add_argument("--cache-mb", type=float, nargs="+", default=[], help="budget(s) in MiB")
    ap.add_argument(
        "--cache-share",
        type=float,
        nargs="+",
        default=[],
        help="budget(s) as a fraction of all experts (--compare)",
    )
    ap.add_argument(
        "--protected",
        type=float,
        nargs="+",
        default=[0.9],
        help="the simulated SLRU's protected segment(s), a fraction of the budget (--compare)",
    )
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument(
        "--decode-steps", type=int, default=47, help="decode steps replayed (0: all; 47 = a -n 48 run)"
    )
    ap.add_argument("--tail", type=int, default=24, help="steady state: the last N decode steps")
    args = ap.parse_args()
    if args.compare:
        budgets: list[tuple[str, Callable[[Trace], int]]] = [
            (f"{mb:g} MiB", lambda t, mb=mb: int(mb * 1048576)) for mb in args.cache_mb
        ]
        budgets += [
            (
                f"{share:.0%} of the experts",
                lambda t, share=share: int(share * t.n_expert * sum(t.entry_bytes)),
            )
            for share in args.cache_share
        ]
        compare(args.compare, budgets, args.decode_steps, args.ubatch, args.tail, args.protected)
        return
    if not args.short or not args.long or len(args.short) != len(args.long) or len(args.cache_mb) != 1:
        raise SystemExit("--short and --long need as many traces each, and one --cache-mb")
    budget = int(args.cache_mb[0] * 1048576)

    def load(path: str) -> Trace:
        return load_trace(path, ubatch=args.ubatch, decode_steps=args.decode_steps)

    s, lg = load(args.short[0]), load(args.long[0])
    runs = {"short": s, "long": lg}
    cap = budget // max(s.entry_bytes)
    print(f"budget {budget} B = {cap} entries; share {cap // sum(1 for x in s.entry_bytes if x)} per layer")
    print(f"pair 1: {args.short[0]} vs {args.long[0]}")
    print("\n# 1. validation (the trace's residency is only meaningful for the budget it was recorded at)")
    for name, t in runs.items():
        print(validate(name, t, budget))

    def row(label: str, a: Tally, b: Tally) -> None:
        n = len(a.slots)
        tail = max(0, n - args.tail)
        print(
            f"| {label} | {a.rate():.1f} | {b.rate():.1f} | {a.rate() - b.rate():+.1f} | "
            f"{a.rate(tail):.1f} | {b.rate(tail):.1f} | {a.rate(tail) - b.rate(tail):+.1f} |"
        )

    def scenarios(s: Trace, lg: Trace) -> dict[str, tuple[Tally, Tally]]:
        return {
            "its own prefill's state (as measured)": (
                decode_from(s, budget, "own"),
                decode_from(lg, budget, "own"),
            ),
            "empty cache": (decode_from(s, budget, "empty"), decode_from(lg, budget, "empty")),
            "the OTHER run's prefill state": (
                decode_from(s, budget, "other", lg),
                decode_from(lg, budget, "other", s),
            ),
            "own prefill, no prefill read-ahead": (
                decode_from(s, budget, "own", prefill_ahead=False),
                decode_from(lg, budget, "own", prefill_ahead=False),
            ),
            "its own decode replayed once before (self-warm)": (
                decode_from(s, budget, "self-warm"),
                decode_from(lg, budget, "self-warm"),
            ),
            "oracle: decode's most-used entries preloaded": (
                decode_from(s, budget, "oracle-global"),
                decode_from(lg, budget, "oracle-global"),
            ),
            "oracle: decode's top-share per layer preloaded": (
                decode_from(s, budget, "oracle-layer"),
                decode_from(lg, budget, "oracle-layer"),
            ),
            "Belady MIN from empty (bound for any replacement)": (
                belady(s.decode(), cap),
                belady(lg.decode(), cap),
            ),
        }

    def replacements(s: Trace, lg: Trace) -> dict[str, tuple[Tally, Tally]]:
        out = {}
        for vk, hl, start in (
            ("lru", 0, "own"),
            ("lru2", 0, "own"),
            ("lru2", 0, "empty"),
            ("lfu", 4, "own"),
            ("lfu", 16, "own"),
            ("lfu", 64, "own"),
        ):
            names = {
                "lru": "LRU (bmoe before the SLRU)",
                "lru2": "LRU-2",
                "lfu": f"decayed LFU, half-life {hl} tokens",
            }
            label = names[vk]
            if start == "empty":
                label += ", from empty"
            out[label] = (
                replacement_sim(s, budget, vk, start, hl or 16.0),
                replacement_sim(lg, budget, vk, start, hl or 16.0),
            )
        for frac in (0.5, 0.75, 0.9):
            out[f"SLRU, protected {frac:.0%}"] = (slru_sim(s, budget, frac), slru_sim(lg, budget, frac))
        return out

    header = (
        "| {} | short | long | gap | short tail | long tail | tail gap |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    print(
        f"\n# 2. scenarios (decode hit %; short = {s.n_prompt}, long = {lg.n_prompt} prompt tokens; "
        f"tail = last {args.tail} decode steps)"
    )
    print(header.format("decode started from"))
    for label, (ta, tb) in scenarios(s, lg).items():
        row(label, ta, tb)

    print("\n# 3. routing concentration")
    for name, t in runs.items():
        print(f"{name} ({t.n_prompt} prompt tokens):")
        for line in concentration(t, budget):
            print(line)

    print("\n# 4. prefill rules (decode from each run's own prefill state, simulated)")
    print(header.format("prefill rule"))
    for label, rule in RULES.items():
        row(label, decode_from(s, budget, "own", rule=rule), decode_from(lg, budget, "own", rule=rule))

    print("\n# 5. decode replacement rules (decode only; from the state bmoe's prefill leaves, or empty)")
    print(header.format("decode replacement"))
    for label, pair in replacements(s, lg).items():
        row(label, *pair)

    if len(args.short) == 1:
        return
    print(f"\n# 6. over {len(args.short)} pairs (short | long | gap, all decode steps; tail gap)")
    pairs = [(load(a), load(b)) for a, b in zip(args.short, args.long, strict=True)]
    table: dict[str, list[tuple[float, float, float, float]]] = {}
    for ps, pl in pairs:
        n = args.tail
        res: dict[str, tuple[Tally, Tally]] = dict(scenarios(ps, pl))
        res.update(
            {
                f"rule {k}": (decode_from(ps, budget, "own", rule=r), decode_from(pl, budget, "own", rule=r))
                for k, r in RULES.items()
            }
        )
        res.update({f"decode {k}": v for k, v in replacements(ps, pl).items()})
        for label, (a, b) in res.items():
            ta, tb = max(0, len(a.slots) - n), max(0, len(b.slots) - n)
            table.setdefault(label, []).append((a.rate(), b.rate(), a.rate(ta), b.rate(tb)))
    pair_cols = " | ".join(f"pair {i + 1}" for i in range(len(pairs)))
    print(f"| scenario | {pair_cols} | mean short | mean long | mean gap | mean tail gap |")
    print("| --- |" + " ---: |" * (len(pairs) + 4))
    for label, vals in table.items():
        cells = " | ".join(f"{a:.1f} / {b:.1f} ({a - b:+.1f})" for a, b, _, _ in vals)
        ma = sum(v[0] for v in vals) / len(vals)
        mb = sum(v[1] for v in vals) / len(vals)
        mt = sum(v[2] - v[3] for v in vals) / len(vals)
        print(f"| {label} | {cells} | {ma:.1f} | {mb:.1f} | {ma - mb:+.1f} | {mt:+.1f} |")


if __name__ == "__main__":
    main()
