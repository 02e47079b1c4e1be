"""The one place where llama.cpp's return codes become typed errors."""

from __future__ import annotations

from bmoe.errors import DecodeAbortedError, DecodeError, KvCacheFullError

# llama.h: llama_decode returns 0 on success, 1 when no KV slot was found for the batch,
# 2 when aborted (abort callback), -1 for an invalid batch, < -1 for other errors.
_DECODE_MEANINGS = {
    1: (KvCacheFullError, "no KV cache slot for the batch (context full)"),
    2: (DecodeAbortedError, "aborted by the abort callback"),
    -1: (DecodeError, "invalid input batch"),
}


def check_decode(code: int) -> None:
    """Raise the typed error for a non-zero ``llama_decode`` return code."""
    if code == 0:
        return
    kind, meaning = _DECODE_MEANINGS.get(code, (DecodeError, "internal error"))
    raise kind(f"llama_decode failed: {meaning} (code {code})", code)
