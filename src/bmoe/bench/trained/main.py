"""``python -m bmoe.bench.trained --out DIR``: train, export, check, measure.

1. the corpus (:mod:`~bmoe.bench.trained.corpus`), tokenized; held-out windows spread over
   the held-out text;
2. the untrained model's routing on them (the random-router baseline);
3. training for ``--minutes`` of wall time (progress on stderr);
4. the weights, ``DIR/trained-weights.npz`` (``--from-weights`` starts from such a file and
   skips training, or with ``--resume`` trains on from it, for example at a longer
   ``--context``), and the GGUF, ``DIR/trained-moe.gguf``;
5. llama.cpp's logits on the first held-out windows against torch's: exit status 1 when
   they differ by more than the tolerance;
6. with ``--bench-scale``, the bench-scale file (each expert padded with zeros to a real
   model's size and quantized to Q4_0, :mod:`~bmoe.bench.trained.padded`), checked against
   torch on the weights it computes with, written where ``python -m bmoe.bench
   --model-kind trained`` finds it (``--bench-out`` elsewhere);
7. the figures, ``DIR/figures.json``, and the tables on stdout.

``--bench`` sets the shape of the bench's trained model (16 layers, 64 experts, top-8, 40
minutes) and ``--bench-scale``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from bmoe.bench.trained.corpus import machine_corpus
from bmoe.bench.trained.export import write_gguf
from bmoe.bench.trained.figures import figures, uniform_chance
from bmoe.bench.trained.init import random_weights
from bmoe.bench.trained.layout import TrainedDims, routers
from bmoe.bench.trained.padded import bench_width, write_padded_gguf
from bmoe.bench.trained.table import layer_table, summary_table
from bmoe.bench.trained.tokens import spread_windows, tokenize
from bmoe.bench.trained.torchlib import TorchMissingError, load_torch

if TYPE_CHECKING:
    from bmoe.bench.trained.train import TrainResult

GGUF_NAME = "trained-moe.gguf"
FIGURES_NAME = "figures.json"
WEIGHTS_NAME = "trained-weights.npz"
NARROW_NAME = "trained-moe-q4_0.gguf"  # the experts in Q4_0 at their trained width: the padding's check
QUANTIZED_MAX_DIFF = 2.0
QUANTIZED_MEAN_DIFF = 2e-2
"""llama.cpp's Q4_0 matmuls take Q8_0-quantized activations, which the reference does not:
measured on a 2-layer model, max 0.69 and mean 4e-3 against torch on the same dequantized
weights. A wrong layout or norm moves logits by whole units on average."""
BENCH_DIMS = TrainedDims(n_layer=16, n_expert=64, n_expert_used=8)
"""The bench's trained model (``--bench``): the bench model's depth and top-k, half its experts."""
BENCH_MINUTES = 40.0
TOKENS_PER_STEP = 2048
"""Tokens a training step sees: 8 windows of the default 256 positions, one of 2,048."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.bench.trained",
        description=(
            "Train a small qwen3moe on text found on this machine (torch, CPU), export it as GGUF, "
            "check llama.cpp's logits against torch's, and report routing figures (LRU hit rate, "
            "stale-gate agreement, previous-token overlap, balance) against the untrained model."
        ),
    )
    default = TrainedDims()
    p.add_argument("--out", type=Path, required=True, help=f"folder for {GGUF_NAME} and {FIGURES_NAME}")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help=f"training wall time (default 6; {BENCH_MINUTES:g} with --bench)",
    )
    p.add_argument("--layers", type=int, default=None, help=f"layers (default {default.n_layer})")
    p.add_argument(
        "--experts", type=int, default=None, help=f"experts per layer (default {default.n_expert})"
    )
    p.add_argument(
        "--top-k", type=int, default=None, help=f"experts used per token (default {default.n_expert_used})"
    )
    p.add_argument(
        "--expert-width",
        type=int,
        default=None,
        help=f"experts' hidden width, trained (default {default.n_ff_exp})",
    )
    p.add_argument("--embd", type=int, default=None, help=f"model width (default {default.n_embd})")
    p.add_argument(
        "--context",
        type=int,
        default=None,
        help=f"positions trained, the GGUF's context length (default {default.n_ctx}); each step "
        f"trains on about {TOKENS_PER_STEP:,} tokens whatever the context",
    )
    p.add_argument(
        "--bench",
        action="store_true",
        help=f"the bench's trained model: {BENCH_DIMS.n_layer} layers, {BENCH_DIMS.n_expert} experts, "
        f"top-{BENCH_DIMS.n_expert_used}, {BENCH_MINUTES:g} minutes, and --bench-scale "
        "(the flags above override)",
    )
    p.add_argument(
        "--bench-scale",
        action="store_true",
        help="also write the model with each expert padded with zeros to the bench model's expert size "
        "and quantized to Q4_0 (where python -m bmoe.bench --model-kind trained finds it)",
    )
    p.add_argument(
        "--pad-width", type=int, default=0, help="padded expert width (default: the bench model's bytes)"
    )
    p.add_argument("--bench-out", type=Path, default=None, help="where to write the bench-scale file instead")
    p.add_argument(
        "--from-weights", type=Path, default=None, help=f"start from a {WEIGHTS_NAME}: no training"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --from-weights: train on from them for --minutes (a fresh optimizer, its peak "
        "rate the end rate of a first run's schedule)",
    )
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
    minutes = args.minutes if args.minutes is not None else (BENCH_MINUTES if args.bench else 6.0)
    if minutes <= 0 or args.seed < 0 or args.windows < 1 or not 1 <= args.check_windows <= args.windows:
        _say("need --minutes > 0, --seed >= 0 and 1 <= --check-windows <= --windows")
        return 2
    if args.resume and args.from_weights is None:
        _say("--resume trains on from --from-weights: give both")
        return 2
    try:
        dims = chosen_dims(args)
    except ValueError as exc:
        _say(str(exc))
        return 2
    try:
        load_torch()
    except TorchMissingError as exc:
        _say(str(exc))
        return 2
    # torch before llama_cpp: with llama.cpp's OpenMP runtime loaded first, a training step
    # took three to twenty times longer (the import order is why these imports are here)
    from bmoe.bench.trained.check import compare, depth_tolerance, llama_logits
    from bmoe.bench.trained.held_out import run_held_out
    from bmoe.bench.trained.train import TrainConfig, train

    corpus = machine_corpus()
    train_ids, held_ids = tokenize(corpus.train), tokenize(corpus.held_out)
    _say(f"{corpus.text()}; {len(train_ids):,} and {len(held_ids):,} tokens")
    _say(
        f"model: {dims.n_layer} layers x {dims.n_expert} experts (top-{dims.n_expert_used}) of width "
        f"{dims.n_ff_exp}, {dims.n_embd} wide"
    )
    windows = spread_windows(held_ids, dims.n_ctx, args.windows)
    initial = random_weights(dims, args.seed)
    before = run_held_out(dims, initial, windows)
    _say(f"untrained: held-out loss {before.loss:.3f} nats/token on {windows.size:,} tokens")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    config = TrainConfig(
        minutes=minutes, seed=args.seed, threads=args.threads, batch=max(1, TOKENS_PER_STEP // dims.n_ctx)
    )
    if args.resume:
        # a first run ends at min_lr_share of its rate: training on from there at the full
        # rate undid what it had learned (the loss rose within 3 steps)
        config = attrs.evolve(config, lr=config.lr * config.min_lr_share)
    if args.from_weights is not None and not args.resume:
        trained = load_weights(args.from_weights)
        _say(f"weights from {args.from_weights}: {trained.steps} steps trained, no training now")
    elif args.from_weights is not None:
        earlier = load_weights(args.from_weights)
        _say(f"weights from {args.from_weights}: {earlier.steps} steps trained; training on")
        trained = resumed(earlier, train(dims, earlier.weights, train_ids, config))
        save_weights(out / WEIGHTS_NAME, trained)
    else:
        trained = train(dims, initial, train_ids, config)
        save_weights(out / WEIGHTS_NAME, trained)
    after = run_held_out(dims, trained.weights, windows)
    _say(f"trained: {trained.steps} steps, held-out loss {after.loss:.3f} nats/token")

    meta = {
        "seed": args.seed,
        "steps": trained.steps,
        "tokens": trained.tokens,
        "corpus_bytes": len(corpus.train),
    }
    gguf = write_gguf(out / GGUF_NAME, dims, trained.weights, meta=meta)
    n_check = args.check_windows
    check = compare(
        list(after.logits[:n_check]),
        llama_logits(gguf, windows[:n_check].tolist(), n_threads=args.threads),
        depth_tolerance(dims.n_layer),
    )
    _say(check.text())
    checks = [check]
    bench_file = None
    if args.bench or args.bench_scale:
        width = args.pad_width or bench_width(dims.n_embd)
        bench_file = args.bench_out or cached_trained_path(dims, args.seed, width)
        _say(f"bench scale: experts padded from {dims.n_ff_exp} to {width} wide, Q4_0, into {bench_file}")
        bench_file, computed = write_padded_gguf(bench_file, dims, trained.weights, width, meta=meta)
        narrow, _ = write_padded_gguf(out / NARROW_NAME, dims, trained.weights, dims.n_ff_exp, meta=meta)
        check_ids = windows[:n_check].tolist()
        padded_logits = llama_logits(bench_file, check_ids, n_threads=args.threads)
        checks.append(
            compare(
                llama_logits(narrow, check_ids, n_threads=args.threads),
                padded_logits,
                tolerance=0.0,
                label=f"padding: llama.cpp, {width}-wide vs {dims.n_ff_exp}-wide Q4_0 experts,",
            )
        )
        reference = run_held_out(dims, computed, windows[:n_check])
        checks.append(
            compare(
                list(reference.logits),
                padded_logits,
                tolerance=QUANTIZED_MAX_DIFF,
                mean_tolerance=QUANTIZED_MEAN_DIFF,
                label="quantized: llama.cpp vs torch on the dequantized experts,",
            )
        )
        for c in checks[1:]:
            _say(f"bench scale: {c.text()}")

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
        "bench_scale": None
        if bench_file is None
        else {
            "gguf": str(bench_file),
            "gguf_bytes": bench_file.stat().st_size,
            "checks": [{**attrs.asdict(c), "ok": c.ok, "windows": n_check} for c in checks[1:]],
        },
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
    for c in checks[1:]:
        print(f"bench scale ({bench_file}): {c.text()}")
    for failed in (c for c in checks if not c.ok):
        _say(
            f"FAILED: llama.cpp's logits differ from torch's by {failed.max_abs_diff:.3g} "
            f"(> {failed.tolerance:g}): the export or the torch model is wrong"
        )
    return 0 if all(c.ok for c in checks) else 1


def chosen_dims(args: argparse.Namespace) -> TrainedDims:
    """The shape the flags ask for (``--bench``'s, or the default, with each flag over it)."""
    base = BENCH_DIMS if args.bench else TrainedDims()
    given = {
        "n_layer": args.layers,
        "n_expert": args.experts,
        "n_expert_used": args.top_k,
        "n_ff_exp": args.expert_width,
        "n_embd": args.embd,
        "n_ctx": args.context,
    }
    return attrs.evolve(base, **{k: v for k, v in given.items() if v is not None})


def cached_trained_path(dims: TrainedDims, seed: int, width: int) -> Path:
    """Where the bench keeps the bench-scale trained model of this shape and seed."""
    from bmoe.adapters.cache_dirs import bench_dir

    return bench_dir() / trained_model_name(dims, seed, width)


def trained_model_name(dims: TrainedDims, seed: int, width: int) -> str:
    """The file's name says its shape; the context only where it is not the default 256
    positions (the name the bench already cached stays valid)."""
    context = "" if dims.n_ctx == TrainedDims().n_ctx else f"-C{dims.n_ctx}"
    return (
        f"trained-q4_0-L{dims.n_layer}-E{dims.n_embd}-F{dims.n_ff_exp}p{width}-X{dims.n_expert}"
        f"-K{dims.n_expert_used}{context}-seed{seed}.gguf"
    )


def resumed(earlier: TrainResult, now: TrainResult) -> TrainResult:
    """The weights trained on from ``earlier``, with the steps, tokens and time of both."""
    return attrs.evolve(
        now,
        steps=earlier.steps + now.steps,
        tokens=earlier.tokens + now.tokens,
        seconds=earlier.seconds + now.seconds,
    )


def save_weights(path: Path, trained: TrainResult) -> None:
    """The trained weights and their provenance, as one ``.npz``."""
    arrays: dict[str, Any] = dict(trained.weights)
    for key in ("steps", "tokens", "seconds", "loss", "balance_loss"):
        arrays[f"__{key}"] = np.asarray(getattr(trained, key))
    np.savez(path, allow_pickle=False, **arrays)


def load_weights(path: Path) -> TrainResult:
    """What :func:`save_weights` wrote."""
    from bmoe.bench.trained.train import TrainResult

    with np.load(path) as data:
        weights = {k: np.asarray(data[k], dtype=np.float32) for k in data.files if not k.startswith("__")}
        info = {k[2:]: data[k].item() for k in data.files if k.startswith("__")}
    return TrainResult(
        weights=weights,
        steps=int(info["steps"]),
        tokens=int(info["tokens"]),
        seconds=float(info["seconds"]),
        loss=float(info["loss"]),
        balance_loss=float(info["balance_loss"]),
    )
