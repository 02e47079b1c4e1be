"""Benchmark (not a test): replay decode routing through the cache's evictions, no timing.

    python tools/replay_eviction.py --route-trace rt.csv [rt2.csv ...] [--shares 10,25,50]
    python tools/replay_eviction.py --trained-weights DIR/trained-weights.npz [--windows 32]
    python tools/replay_eviction.py --trained-weights DIR/trained-weights.npz --sequences 1,2,4,8

The routing is either the decode rows of ``--route-trace`` CSVs (what ``--route-trace`` wrote
for a run fed one token per ``llama_decode``: docs/telemetry.md), or the trained bench
model's own routing of its held-out text, computed in torch from its weights
(``python -m bmoe.bench.trained``; held-out windows spread over the held-out files, one after
another as successive conversations). Routing does not depend on the cache (streaming is
exact), so the same routing can be replayed under every rule.

Each decode token's MoE layers are requested in order through the C cache core
(``ExpertCacheCore``, which the equivalence tests hold equal to ``ExpertCachePolicy`` decision
for decision), every entry the same size, the budget a share of all the (layer, expert)
entries: LRU and SLRU (``--cache-policy lru``, ``slru``), LFU at each ``--half-lives``
(``--cache-policy lfu --cache-half-life N``), adaptive (``--cache-policy adaptive``, the
default: half-life 64), and Belady's MIN (evict the entry used again furthest ahead: the bound
for any rule without foresight). Prints the hit rates as a Markdown table.

``--sequences``: the trained model's held-out windows decoded N at a time instead (a step's
request per layer is the union of the N tokens' experts, as decode, as the engine plans a
step of N sequences), at each budget: hit rate and misses per generated token, SLRU and LFU.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

Routed = npt.NDArray[np.int32]  # [n_tok, n_layer, k]


def routing_from_traces(paths: Sequence[Path]) -> tuple[Routed, int]:
    """The decode rows of route traces, one token per (turn, step): ``[n_tok, n_moe_layer, k]``,
    and the number of experts (the largest id + 1)."""
    tokens: list[list[list[int]]] = []
    for path in paths:
        steps: dict[tuple[int, int], dict[int, list[tuple[int, int]]]] = {}
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                if row["phase"] != "decode":
                    continue
                key = (int(row["turn"]), int(row["step"]))
                steps.setdefault(key, {}).setdefault(int(row["layer"]), []).append(
                    (int(row["slot"]), int(row["expert"]))
                )
        for key in sorted(steps):
            layers = steps[key]
            tokens.append([[e for _, e in sorted(layers[layer])] for layer in sorted(layers)])
    routed = np.array(tokens, dtype=np.int32)
    if routed.ndim != 3 or not routed.size:
        raise SystemExit("no decode rows of equal shape in the traces (fed one token per llama_decode?)")
    return routed, int(routed.max()) + 1


def routing_from_trained(weights: Path, n_windows: int, *, flat: bool = True) -> tuple[Routed, int]:
    """The trained model's routing of ``n_windows`` held-out windows, in torch: one window
    after another (``[n_tok, n_layer, k]``), or ``flat=False`` by window
    (``[n_win, n_tok, n_layer, k]``)."""
    from bmoe.bench.trained.corpus import machine_corpus
    from bmoe.bench.trained.held_out import run_held_out
    from bmoe.bench.trained.main import BENCH_DIMS, load_weights
    from bmoe.bench.trained.tokens import spread_windows, tokenize

    dims = BENCH_DIMS
    windows = spread_windows(tokenize(machine_corpus().held_out), dims.n_ctx, n_windows)
    held = run_held_out(dims, load_weights(weights).weights, windows)
    if not flat:
        return held.routed.astype(np.int32), dims.n_expert
    routed = held.routed.reshape(-1, held.routed.shape[2], held.routed.shape[3])
    return routed.astype(np.int32), dims.n_expert


def replay(routed: Routed, n_expert: int, entries: int, eviction: str, half_life: int = 64) -> float:
    """The hit rate of the C cache core over the routing, ``entries`` entries of budget."""
    from bmoe.cext.cache_core import ExpertCacheCore

    n_layer = routed.shape[1]
    core = ExpertCacheCore(entries, [1] * n_layer, n_expert, eviction=eviction, half_life=half_life)
    rows = np.empty((routed.shape[0] * n_layer, routed.shape[2] + 1), dtype=np.int32)
    rows[:, 0] = np.tile(np.arange(n_layer, dtype=np.int32), routed.shape[0])
    rows[:, 1:] = routed.reshape(-1, routed.shape[2])
    core.request_many(np.ascontiguousarray(rows))
    c = core.counters()
    return c["hits"] / (c["hits"] + c["misses"])


def replay_sequences(
    windows: npt.NDArray[np.int32], n_expert: int, entries: int, eviction: str, n_seq: int
) -> tuple[float, float]:
    """Windows ``[n_win, n_tok, n_layer, k]`` decoded ``n_seq`` at a time through the C core:
    (hit rate, misses per generated token)."""
    from bmoe.cext.cache_core import ExpertCacheCore

    n_win, n_tok, n_layer, _ = windows.shape
    core = ExpertCacheCore(entries, [1] * n_layer, n_expert, eviction=eviction)
    for first in range(0, n_win - n_seq + 1, n_seq):
        group = windows[first : first + n_seq]
        for t in range(n_tok):
            for layer in range(n_layer):
                ids = group[:, t, layer].reshape(-1).tolist()
                core.request(layer, ids, n_tokens=n_seq, decode=True if n_seq > 1 else None)
    c = core.counters()
    generated = (n_win // n_seq) * n_seq * n_tok
    return c["hits"] / (c["hits"] + c["misses"]), c["misses"] / generated


def belady(routed: Routed, entries: int) -> float:
    """Belady's MIN over the same requests: on a miss with the cache full, evict the entry
    (not one this request wants) whose next use is furthest ahead."""
    import heapq

    n_tok, n_layer, _ = routed.shape
    requests = [
        [(layer, int(e)) for e in dict.fromkeys(routed[t, layer].tolist())]
        for t in range(n_tok)
        for layer in range(n_layer)
    ]
    never = len(requests)
    next_use: list[dict[tuple[int, int], int]] = [{} for _ in requests]
    seen: dict[tuple[int, int], int] = {}
    for r in range(len(requests) - 1, -1, -1):
        for entry in requests[r]:
            next_use[r][entry] = seen.get(entry, never)
            seen[entry] = r
    resident: dict[tuple[int, int], int] = {}  # entry -> its next use
    heap: list[tuple[int, tuple[int, int]]] = []  # (-next use, entry), stale ones skipped
    hits = misses = 0
    for r, want in enumerate(requests):
        wanted = set(want)
        for entry in want:
            if entry in resident:
                hits += 1
            else:
                misses += 1
                held: list[tuple[int, tuple[int, int]]] = []
                while len(resident) >= entries and heap:
                    neg, victim = heapq.heappop(heap)
                    if resident.get(victim) != -neg:
                        continue  # stale
                    if victim in wanted:
                        held.append((neg, victim))
                        continue
                    del resident[victim]
                for item in held:
                    heapq.heappush(heap, item)
            resident[entry] = next_use[r][entry]
            heapq.heappush(heap, (-resident[entry], entry))
    return hits / (hits + misses)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--route-trace", type=Path, nargs="+")
    source.add_argument("--trained-weights", type=Path)
    p.add_argument("--windows", type=int, default=32, help="held-out windows of the trained model")
    p.add_argument("--shares", default="10,25,50", help="budgets, %% of all (layer, expert) entries")
    p.add_argument("--half-lives", default="16,32,64,128,256", help="LFU's half-lives, decode tokens")
    p.add_argument("--no-belady", action="store_true")
    p.add_argument("--sequences", default="", help="with --trained-weights: windows decoded N at a time")
    args = p.parse_args()
    if args.sequences:
        if not args.trained_weights:
            raise SystemExit("--sequences needs --trained-weights (whole windows to decode side by side)")
        windows, n_expert = routing_from_trained(args.trained_weights, args.windows, flat=False)
        n_layer = windows.shape[2]
        print(
            "| budget | sequences | SLRU hit % | SLRU misses per token | LFU hit % | LFU misses per token |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for share in (float(s) for s in args.shares.split(",") if s.strip()):
            entries = max(1, round(n_layer * n_expert * share / 100))
            for n in (int(x) for x in args.sequences.split(",") if x.strip()):
                slru = replay_sequences(windows, n_expert, entries, "slru", n)
                lfu = replay_sequences(windows, n_expert, entries, "lfu", n)
                cells = [f"{share:g}%", str(n), f"{100 * slru[0]:.1f}", f"{slru[1]:.1f}"]
                cells += [f"{100 * lfu[0]:.1f}", f"{lfu[1]:.1f}"]
                print("| " + " | ".join(cells) + " |", flush=True)
        return
    if args.route_trace:
        routed, n_expert = routing_from_traces(args.route_trace)
    else:
        routed, n_expert = routing_from_trained(args.trained_weights, args.windows)
    n_tok, n_layer, k = routed.shape
    print(
        f"routing: {n_tok} decode tokens, {n_layer} MoE layers x {n_expert} experts, top-{k}", file=sys.stderr
    )
    half_lives = [int(h) for h in args.half_lives.split(",") if h.strip()]
    head = ["budget", "LRU", "SLRU", *(f"LFU, half-life {h}" for h in half_lives), "adaptive (the default)"]
    if not args.no_belady:
        head.append("Belady's MIN")
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))
    for share in (float(s) for s in args.shares.split(",") if s.strip()):
        entries = max(1, round(n_layer * n_expert * share / 100))
        cells = [f"{share:g}% ({entries} entries)"]
        cells += [f"{100 * replay(routed, n_expert, entries, rule):.1f}" for rule in ("lru", "slru")]
        cells += [f"{100 * replay(routed, n_expert, entries, 'lfu', h):.1f}" for h in half_lives]
        cells.append(f"{100 * replay(routed, n_expert, entries, 'adaptive'):.1f}")
        if not args.no_belady:
            cells.append(f"{100 * belady(routed, entries):.1f}")
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
