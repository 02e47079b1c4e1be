"""ggml's functions in the library llama-cpp-python loaded (``llama_cpp._ggml.libggml``, which
also resolves the symbols of the libraries it links: ggml-base, the backends): typed for a call
from Python, or as an address for the C extension. One place, so that two callers never give
one function different signatures (ctypes keeps one object per name)."""

from __future__ import annotations

import ctypes

import llama_cpp._ggml as ggml_lib


def _function(name: str) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    return getattr(ggml_lib.libggml, name)


def typed(name: str, restype: object, *argtypes: object) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """A ggml function of the loaded library, with its C signature."""
    f = _function(name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


def address(name: str) -> int:
    """Where the loaded library has ``name`` (AttributeError where it has none)."""
    return int(ctypes.cast(_function(name), ctypes.c_void_p).value or 0)
