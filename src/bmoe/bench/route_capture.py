"""Record a model's decode routing, teacher-forced on the bench's fixed text, as a compact
trace for the cache replays (``bmoe.bench.replay``).

    python -m bmoe.bench.route_capture MODEL.gguf OUT.npz [--tokens N]

The first token of ``bmoe.bench.text.TEXT`` is decoded alone, then every next token of the
text one at a time (teacher forcing: a random-weight model's greedy output repeats one
token, its routing would never move), each MoE layer's selected experts recorded by the C
eval callback (``RouteRecorder``) as the graph uses them. ``OUT.npz`` holds ``experts``:
``uint8`` (``uint16`` past 256 experts) ``[tokens, moe_layers, k]`` in slot order,
``layers``: the MoE layers' indices, and ``n_expert``. No timing: the model runs resident.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.bench.text import TEXT
from bmoe.cext.route_recorder import RouteRecorder


def capture(model_path: Path, n_tokens: int) -> tuple[np.ndarray, list[int], int]:
    """``(experts [tokens, moe_layers, k], moe layers, n_expert)`` of ``n_tokens`` decode
    steps (fewer when the text is shorter)."""
    with LlamaModel(model_path) as model:
        tokens = model.tokenize(TEXT)[: n_tokens + 1]
        n_expert = model.n_expert
        recorder = RouteRecorder(max_records=len(tokens) * 256 + 16, max_ids=len(tokens) * 256 * 16 + 16)
        params = ContextParams(n_ctx=len(tokens) + 8, n_batch=8, n_ubatch=8, n_threads=2)
        steps: list[dict[int, np.ndarray]] = []
        with LlamaContext(model, params, eval_callback=recorder) as ctx:
            for pos, token in enumerate(tokens[:-1]):
                recorder.clear()
                ctx.decode([token], pos)
                steps.append({layer: ids[0] for layer, ids, _ in recorder.records()})
                if recorder.overflowed:
                    raise RuntimeError("the route recorder overflowed")
    layers = sorted(steps[0])
    experts = np.array([[step[layer] for layer in layers] for step in steps])
    return experts, layers, n_expert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bmoe.bench.route_capture", description=__doc__.split("\n")[0]
    )
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--tokens", type=int, default=1000, help="decode steps to record (at most the text's)"
    )
    args = parser.parse_args(argv)
    experts, layers, n_expert = capture(args.model, args.tokens)
    dtype = np.uint8 if n_expert <= 256 else np.uint16
    np.savez_compressed(args.out, experts=experts.astype(dtype), layers=np.array(layers), n_expert=n_expert)
    print(f"{args.out}: {experts.shape[0]} tokens x {experts.shape[1]} MoE layers x top-{experts.shape[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
