"""``python -m bmoe.bench.trained --out DIR``: train, export, check, measure.

1. the corpus (:mod:`~bmoe.bench.trained.corpus`), tokenized; held-out windows spread over
   the held-out text;
2. the untrained model's routing on them (the random-router baseline);
3. training for ``--minutes`` of wall time (progress on stderr);
4. the GGUF, ``DIR/trained-moe.gguf``;
5. llama.cpp's logits on the first held-out windows against torch's: exit status 1 when
   they differ by more than the tolerance;
6. the figures, ``DIR/figures.json``, and the tables on stdout.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from bmoe.bench.trained.corpus import machine_corpus
from bmoe.bench.trained.export import write_gguf
from bmoe.bench.trained.figures import figures, uniform_chance
from bmoe.bench.trained.init import random_weights
from bmoe.bench.trained.layout import TrainedDims, routers
from bmoe.bench.trained.table import layer_table, summary_table
from bmoe.bench.trained.tokens import spread_windows, tokenize
from bmoe.bench.trained.torchlib import TorchMissingError, load_torch

GGUF_NAME = "trained-moe.gguf"
FIGURES_NAME = "figures.json"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.bench.trained",
        description=(
            "Train a small qwen3moe on text found on this machine (torch, CPU), export it as GGUF, "
            "check llama.cpp's logits against torch's, and report routing figures (LRU hit rate, "
            "stale-gate agreement, previous-token overlap, balance) against the untrained model."
        ),
    )
    p.add_argument("--out", type=Path, required=True, help=f"folder for {GGUF_NAME} and {FIGURES_NAME}")
    p.add_argument("--minutes", type=float, default=6.0, help="training wall time (default 6)")
    p.add_argument("--seed", type=int, default=0, help="initial weights and batch order (default 0)")
    p.add_argument("--threads", type=int, default=2, help="torch and llama.cpp threads (default 2)")
    p.add_argument("--windows", type=int, default=16, help="held-out windows of n_ctx tokens (default 16)")
    p.add_argument(
        "--check-windows", type=int, default=4, help="of those, how many llama.cpp checks (default 4)"
    )
    return p


def _not_weights(attribute: attrs.Attribute[Any], _: object) -> bool:
    return attribute.name != "weights"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(argv if argv is not None else sys.argv[1:])
    args = parser().parse_args(given)
    if args.minutes <= 0 or args.seed < 0 or args.windows < 1 or not 1 <= args.check_windows <= args.windows:
        _say("need --minutes > 0, --seed >= 0 and 1 <= --check-windows <= --windows")
        return 2
    try:
        load_torch()
    except TorchMissingError as exc:
        _say(str(exc))
        return 2
    # torch before llama_cpp: with llama.cpp's OpenMP runtime loaded first, a training step
    # took three to twenty times longer (the import order is why these imports are here)
    from bmoe.bench.trained.check import compare, llama_logits
    from bmoe.bench.trained.held_out import run_held_out
    from bmoe.bench.trained.train import TrainConfig, train

    corpus = machine_corpus()
    train_ids, held_ids = tokenize(corpus.train), tokenize(corpus.held_out)
    _say(f"{corpus.text()}; {len(train_ids):,} and {len(held_ids):,} tokens")
    dims = TrainedDims()
    windows = spread_windows(held_ids, dims.n_ctx, args.windows)
    initial = random_weights(dims, args.seed)
    before = run_held_out(dims, initial, windows)
    _say(f"untrained: held-out loss {before.loss:.3f} nats/token on {windows.size:,} tokens")

    config = TrainConfig(minutes=args.minutes, seed=args.seed, threads=args.threads)
    trained = train(dims, initial, train_ids, config)
    after = run_held_out(dims, trained.weights, windows)
    _say(f"trained: {trained.steps} steps, held-out loss {after.loss:.3f} nats/token")

    out: Path = args.out
    gguf = write_gguf(
        out / GGUF_NAME,
        dims,
        trained.weights,
        meta={
            "seed": args.seed,
            "steps": trained.steps,
            "tokens": trained.tokens,
            "corpus_bytes": len(corpus.train),
        },
    )
    n_check = args.check_windows
    check = compare(
        list(after.logits[:n_check]), llama_logits(gguf, windows[:n_check].tolist(), n_threads=args.threads)
    )
    _say(check.text())

    models = {
        "trained": figures(after.routed, after.router_inputs, routers(dims, trained.weights)),
        "untrained (random weights)": figures(before.routed, before.router_inputs, routers(dims, initial)),
    }
    chance = uniform_chance(dims.n_expert, dims.n_expert_used, dims.n_layer, n_tokens=int(windows.size))
    document: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bmoe.bench.trained", *given]),
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "gguf": str(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "model": attrs.asdict(dims),
        "corpus": {
            "roots": list(corpus.roots),
            "train_bytes": len(corpus.train),
            "train_files": corpus.n_train_files,
            "train_tokens": len(train_ids),
            "held_out_bytes": len(corpus.held_out),
            "held_out_files": corpus.n_held_out_files,
            "held_out_tokens": len(held_ids),
        },
        "training": {**attrs.asdict(config), **attrs.asdict(trained, filter=_not_weights)},
        "held_out": {
            "windows": int(windows.shape[0]),
            "tokens": int(windows.size),
            "loss_untrained": before.loss,
            "loss_trained": after.loss,
        },
        "check": {**attrs.asdict(check), "ok": check.ok, "windows": n_check},
        "figures": {name: f.as_json() for name, f in models.items()},
        "uniform_chance": chance,
    }
    (out / FIGURES_NAME).write_text(json.dumps(document, indent=2) + "\n")
    print(
        f"Routing on {windows.size:,} held-out tokens ({windows.shape[0]} windows of {dims.n_ctx}), "
        "teacher-forced:\n"
    )
    print(summary_table(models, chance))
    print("\nTrained model, per layer (stale-gate: the layer predicted):\n")
    print(layer_table(models["trained"]))
    print(f"\n{check.text()}")
    if not check.ok:
        _say(
            f"FAILED: llama.cpp's logits differ from torch's by {check.max_abs_diff:.3g} "
            f"(> {check.tolerance:g}): the export or the torch model is wrong"
        )
        return 1
    return 0
