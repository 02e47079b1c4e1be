"""Generate a completion over any ``IGenerateBackend``."""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable

from bmoe.domain.generation import GenerationRequest, GenerationResult
from bmoe.errors import ContextOverflowError
from bmoe.ports.generate_backend import IGenerateBackend

OnText = Callable[[str], None]


def generate(
    backend: IGenerateBackend, request: GenerationRequest, on_text: OnText | None = None
) -> GenerationResult:
    """Prefill the prompt from an empty context, then decode up to ``n_predict`` tokens.

    ``on_text`` receives the answer as it grows (whole UTF-8 characters only). Raises
    ``ContextOverflowError`` before any compute when prompt + ``n_predict`` exceed the context.
    """
    prompt = backend.tokenize(request.prompt)
    if not prompt:
        raise ContextOverflowError("the prompt tokenizes to nothing")
    need = len(prompt) + request.n_predict
    if need > backend.n_ctx:
        raise ContextOverflowError(
            f"prompt ({len(prompt)} tokens) + n_predict ({request.n_predict}) = {need} "
            f"exceeds the context of {backend.n_ctx} tokens"
        )
    backend.reset()
    t0 = time.perf_counter()
    backend.feed(prompt, 0)
    prefill_s = time.perf_counter() - t0

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tokens: list[int] = []
    pieces: list[str] = []
    stopped = False
    t1 = time.perf_counter()
    while len(tokens) < request.n_predict:
        token = backend.sample()
        if backend.is_eog(token):
            stopped = True
            break
        tokens.append(token)
        piece = decoder.decode(backend.token_bytes(token))
        if piece:
            pieces.append(piece)
            if on_text is not None:
                on_text(piece)
        if len(tokens) < request.n_predict:
            backend.feed([token], len(prompt) + len(tokens) - 1)
    tail = decoder.decode(b"", final=True)
    if tail:
        pieces.append(tail)
        if on_text is not None:
            on_text(tail)
    decode_s = time.perf_counter() - t1
    return GenerationResult(
        prompt_tokens=tuple(prompt),
        tokens=tuple(tokens),
        text="".join(pieces),
        prefill_s=prefill_s,
        decode_s=decode_s,
        stopped_at_eog=stopped,
    )
