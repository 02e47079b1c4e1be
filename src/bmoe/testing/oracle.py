"""A second opinion no code of ours wrote: stock ``llama_cpp.Llama``'s greedy run.

Used by the gates to check bmoe's outputs (resident or streamed) against llama.cpp itself.
The parameters must match the run being checked: same batch sizes and threads, flash
attention off on both sides (stock ``Llama`` turns it off; bmoe's context leaves it on
``auto`` unless told), and an F32/F16 model so weight repacking changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt


def stock_greedy(
    path: Path, prompt: str, n_predict: int, *, n_ctx: int = 256, n_batch: int = 64, n_threads: int = 2
) -> tuple[list[int], npt.NDArray[np.float32]]:
    """Greedy tokens of stock llama-cpp-python after ``prompt`` (specials parsed, no BOS), and
    the logits of the last token it computed (the last generated token is never fed)."""
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
