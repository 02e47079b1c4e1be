"""``python -m bmoe.store -m MODEL [--out PATH] [--check]``: write the model's experts once in
the layout llama.cpp computes with on this machine, so that streamed runs read them without
repacking (``--expert-store auto`` finds the store). Says where and how much before writing."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bmoe.errors import BmoeError
from bmoe.runtime.expert_store_writer import store_plan, write_model_store

GIB = 2**30


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.store",
        description="Write a MoE model's routed experts once in llama.cpp's repacked layout (CPU_REPACK, "
        "repacked by llama.cpp itself), beside bmoe's cache: streamed runs then read each expert straight "
        "into the cache, with no repack on the read lanes. It takes as much disk as the model's experts.",
    )
    p.add_argument(
        "-m", "--model", type=Path, required=True, help="the GGUF (a split model: its first shard)"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="the store's file (default: <cache root>/expert-stores/<model key>.experts, where "
        "--expert-store auto looks; another path is then named with --expert-store PATH)",
    )
    p.add_argument(
        "--check", action="store_true", help="only say whether a store there serves this model here"
    )
    p.add_argument("--force", action="store_true", help="write it again even where the one there serves")
    return p


class _Progress:
    """A line on stderr every tenth of the work."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._next = 0.1

    def __call__(self, done: int, total: int) -> None:
        if done >= self._next * total or done == total:
            elapsed = time.monotonic() - self._t0
            rate = done / GIB / elapsed if elapsed > 0 else 0.0
            print(
                f"  {done / GIB:.2f} of {total / GIB:.2f} GiB ({rate:.2f} GiB/s)", file=sys.stderr, flush=True
            )
            while self._next * total <= done:
                self._next += 0.1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        with store_plan(args.model, args.out) as plan:
            size = plan.manifest.store_bytes / GIB
            if args.check:
                state = (
                    "serves this model here" if plan.current else f"does not serve: {plan.why_not_current}"
                )
                print(f"expert store {plan.path}: {state}")
                return 0 if plan.current else 1
            if plan.current and not args.force:
                said = "already written for this model, this llama.cpp"
                print(f"expert store {plan.path}: {said} ({size:.2f} GiB)")
                return 0
            n = len(plan.manifest.tensors)
            print(
                f"writing {size:.2f} GiB to {plan.path} ({n} expert tensors, repacked by llama.cpp)",
                flush=True,
            )
            t0 = time.monotonic()
            write_model_store(plan, _Progress())
            took = time.monotonic() - t0
            print(f"expert store {plan.path}: written and checked in {took:.1f} s ({size:.2f} GiB)")
    except BmoeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
