"""Warm starts from a usage profile against cold starts, each in a fresh process, under a
disk throttle (docs/benchmarks.md, "A cache that learns").

1. **Learn** two profiles (unthrottled, not timed): *held-out*, from ``--learn-docs`` texts of
   the trained model's training split (other prompts than the one measured), each fed as a
   prompt and a teacher-forced continuation in a process of its own (the profiles merge
   across processes as an app's would); *same*, from the measured text itself (the
   overfitted case: what a profile can do at best).
2. **Measure**, ``--rounds`` times, interleaved (cold, held-out, same; the order rotates by
   round): a fresh process in the I/O group of ``--disk-mib-s``, the model dropped from the
   page cache, loads, waits ``--idle-s`` (an app whose first request comes later; the cold
   start waits as long), prefills the ``--prompt-tokens`` of a held-out text and
   teacher-forces the next ``--tokens``, all measured (no warm-up: the first tokens are the
   point). Each warm run starts from a fresh copy of its profile (the run's own learning is
   thrown away).

    python tools/bench_profile.py --disk-mib-s 400 --cache-share 0.5 --rounds 3

Figures: decode tok/s of the measured tokens, their hit rate, the prefill's seconds, and the
warm start over the cold start of the same round (median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bmoe.bench.confinement import confinement_factory
from bmoe.bench.io_group import DiskThrottle
from bmoe.bench.main import trained_bench_model
from bmoe.bench.model import expert_bytes, tokenize
from bmoe.bench.runner import run_configuration
from bmoe.bench.trained.corpus import machine_corpus

MIB = 1024 * 1024
KINDS = ("cold", "held-out", "same")


def chunks(text: str, n: int, size: int) -> list[str]:
    """``n`` pieces of ``size`` characters spread evenly over ``text``, each starting at a line."""
    out = []
    for i in range(n):
        at = text.find("\n", len(text) * i // n) + 1
        out.append(text[at : at + size])
    return out


def spec(
    args: argparse.Namespace, model: Path, tokens: list[int], key: str, profile: Path | None
) -> dict[str, Any]:
    routing: dict[str, Any] = {"governor": "off", "profile": str(profile) if profile else "off"}
    routing["profile_share"] = args.profile_share
    return {
        "key": key,
        "kind": "stream",
        "cache_mib": args.cache_mib,
        "routing": routing,
        "model": str(model),
        "tokens": tokens,
        "prompt_tokens": args.prompt_tokens,
        "warmup": 0,
        "measure": len(tokens) - args.prompt_tokens,
        "n_ctx": args.n_ctx,
        "threads": args.threads,
        "io_threads": args.io_threads,
        "repack": True,
        "max_seconds": 600.0,
        "idle_s": args.idle_s if key in KINDS else 0.0,
    }


def run(args: argparse.Namespace, model: Path, s: dict[str, Any], throttled: bool) -> dict[str, Any]:
    make_group = None
    if throttled:
        make_group = confinement_factory(model, 0, DiskThrottle(args.disk_mib_s, 0))
    r = run_configuration(s, model=model, make_group=make_group, timeout_s=1800, on_progress=lambda _: None)
    if "error" in r:
        raise SystemExit(f"{s['key']}: {r['error']}")
    return r


def hit_rate(r: dict[str, Any]) -> float:
    c = r["counters"]
    return c["hits"] / max(1, c["hits"] + c["misses"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="default: the trained bench model")
    p.add_argument("--disk-mib-s", type=int, default=400)
    p.add_argument(
        "--cache-share", type=float, default=0.5, help="the cache, as a share of the experts' bytes"
    )
    p.add_argument("--profile-share", type=float, default=0.75)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64, help="decode tokens measured")
    p.add_argument("--learn-docs", type=int, default=8)
    p.add_argument("--learn-tokens", type=int, default=200)
    p.add_argument("--idle-s", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--io-threads", type=int, default=4)
    p.add_argument("--n-ctx", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("profile-bench"))
    args = p.parse_args()
    model = args.model or trained_bench_model(0)
    args.cache_mib = int(args.cache_share * expert_bytes(model) / MIB)
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = machine_corpus()
    measured_text = chunks(corpus.held_out, 1, 4000)[0]
    tokens = tokenize(model, measured_text)[: args.prompt_tokens + args.tokens]
    learn = [
        tokenize(model, t)[: args.prompt_tokens + args.learn_tokens]
        for t in chunks(corpus.train, args.learn_docs, 4000)
    ]
    print(
        f"model {model.name}, cache {args.cache_mib} MiB ({args.cache_share:.0%} of the experts), "
        f"throttle {args.disk_mib_s} MiB/s, prompt {args.prompt_tokens}, measured {args.tokens}",
        file=sys.stderr,
    )

    work = Path(tempfile.mkdtemp(prefix="bmoe-profile-bench-"))
    profiles = {"held-out": work / "held-out.json", "same": work / "same.json"}
    for i, t in enumerate(learn):
        run(args, model, spec(args, model, t, f"learn-held-out-{i}", profiles["held-out"]), throttled=False)
    run(args, model, spec(args, model, tokens, "learn-same", profiles["same"]), throttled=False)
    for kind, path in profiles.items():
        doc = json.loads(path.read_text())
        print(f"{kind} profile: {doc['tokens']:.0f} tokens from {doc['sessions']} processes", file=sys.stderr)

    results: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        order = KINDS[round_no % 3 :] + KINDS[: round_no % 3]
        for kind in order:
            copy = None
            if kind != "cold":
                copy = work / f"run-{kind}.json"
                shutil.copyfile(profiles[kind], copy)
            r = run(args, model, spec(args, model, tokens, kind, copy), throttled=True)
            r["round"] = round_no
            results.append(r)
            print(
                f"round {round_no + 1} {kind:>8}: decode {r['tok_s']:.2f} tok/s, hits {hit_rate(r):.1%}, "
                f"prefill {r['prefill_s']:.2f} s, disk {r.get('disk_read_bytes', 0) / MIB:.0f} MiB",
                file=sys.stderr,
            )
    (args.out / "profile-bench.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=1)
    )

    print(
        f"| start | decode tok/s (first {args.tokens}) | x cold | hit rate | prefill s "
        "| prefill + decode s | x cold |"
    )
    print("|---|---|---|---|---|---|---|")
    by = {(r["round"], r["key"]): r for r in results}
    for kind in KINDS:
        runs = [by[(i, kind)] for i in range(args.rounds)]
        colds = [by[(i, "cold")] for i in range(args.rounds)]
        tok = statistics.median(r["tok_s"] for r in runs)
        ratio = statistics.median(r["tok_s"] / c["tok_s"] for r, c in zip(runs, colds, strict=True))
        total = [r["prefill_s"] + r["decode_s"] for r in runs]
        total_ratio = statistics.median(
            (c["prefill_s"] + c["decode_s"]) / t for t, c in zip(total, colds, strict=True)
        )
        print(
            f"| {kind} | {tok:.2f} | {ratio:.2f} | {statistics.median(hit_rate(r) for r in runs):.1%} | "
            f"{statistics.median(r['prefill_s'] for r in runs):.2f} | {statistics.median(total):.2f} "
            f"| {total_ratio:.2f} |"
        )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
