"""A second opinion no code of ours wrote: stock ``llama_cpp.Llama``'s greedy run.

Used by the gates to check bmoe's outputs (resident or streamed) against llama.cpp itself.
The parameters must match the run being checked: same batch sizes and threads, flash
attention off on both sides (stock ``Llama`` turns it off; bmoe's context leaves it on
``auto`` unless told), and an F32/F16 model so weight repacking changes nothing.

Where llama.cpp's AMX kernel faults (``bmoe.testing.machine.STOCK_IN_PROCESS`` false: the
probe ran llama.cpp's own kernel and it died or computed wrong), or with
``BMOE_STOCK_IN_CHILD=1``, the oracle runs in a child process: a stock llama.cpp that
dies of a signal there skips the test that asked ("stock llama.cpp crashed on this CPU"),
instead of taking the whole test run down with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt


def stock_greedy(
    path: Path, prompt: str, n_predict: int, *, n_ctx: int = 256, n_batch: int = 64, n_threads: int = 2
) -> tuple[list[int], npt.NDArray[np.float32]]:
    """Greedy tokens of stock llama-cpp-python after ``prompt`` (specials parsed, no BOS), and
    the logits of the last token it computed (the last generated token is never fed)."""
    from bmoe.testing.machine import STOCK_IN_PROCESS

    args = {"path": str(path), "prompt": prompt, "n_predict": n_predict, "n_ctx": n_ctx}
    args |= {"n_batch": n_batch, "n_threads": n_threads}
    if not STOCK_IN_PROCESS or os.environ.get("BMOE_STOCK_IN_CHILD") == "1":
        return _in_child(args)
    return _stock_greedy(path, prompt, n_predict, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)


def _in_child(args: dict[str, object]) -> tuple[list[int], npt.NDArray[np.float32]]:
    """``stock_greedy`` in ``python -m bmoe.testing.oracle``; a child killed by a signal
    skips the calling test, naming the signal."""
    import pytest

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.npy"
        done = subprocess.run(
            [sys.executable, "-m", "bmoe.testing.oracle", json.dumps(args | {"out": str(out)})],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode < 0:
            name = signal.Signals(-done.returncode).name
            pytest.skip(f"stock llama.cpp crashed on this CPU ({name}): nothing to compare with")
        if done.returncode != 0:
            status = done.returncode
            raise RuntimeError(f"the stock oracle failed (exit status {status}): {done.stderr[-2000:]}")
        tokens = [int(t) for t in done.stdout.split()]
        return tokens, np.load(out)


def _stock_greedy(
    path: Path, prompt: str, n_predict: int, *, n_ctx: int, n_batch: int, n_threads: int
) -> tuple[list[int], npt.NDArray[np.float32]]:
    stock = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        flash_attn=False,
        verbose=False,
    )
    try:
        tokens: list[int] = []
        for token in stock.generate(stock.tokenize(prompt.encode(), add_bos=False, special=True), temp=0.0):
            tokens.append(token)
            if len(tokens) == n_predict:
                break
        logits = np.ctypeslib.as_array(stock._ctx.get_logits_ith(-1), shape=(stock.n_vocab(),)).copy()
    finally:
        stock.close()
    return tokens, logits


if __name__ == "__main__":
    _args = json.loads(sys.argv[1])
    _tokens, _logits = _stock_greedy(
        Path(_args["path"]),
        _args["prompt"],
        _args["n_predict"],
        n_ctx=_args["n_ctx"],
        n_batch=_args["n_batch"],
        n_threads=_args["n_threads"],
    )
    np.save(_args["out"], _logits)
    print(" ".join(str(t) for t in _tokens))
