"""``MaskSampler``: a llama.cpp sampler that lets through only the tokens a mask allows.

llama.cpp's sampler API takes samplers written outside it (``llama_sampler_init`` with a
``llama_sampler_i`` of callbacks): this one sits in the chain where llama.cpp's own grammar
sampler would, sets every disallowed token's logit to -inf in ``apply`` and hands the chosen
token to the mask in ``accept``. The mask (``ITokenMask``) is the constraint engine's
(llguidance's matcher, ``guidance``). A failure inside a callback cannot raise through C:
it is kept and raised by ``check()`` after the draw.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import llama_cpp
import numpy as np
from numpy.typing import NDArray

from bmoe.errors import GrammarError


class ITokenMask(Protocol):
    """What the sampler asks of a constraint engine, one token at a time."""

    def allowed(self) -> NDArray[np.bool_]:
        """Which token ids may come next (one flag per id of the vocabulary)."""
        ...

    def accept(self, token: int) -> None:
        """``token`` was drawn: advance (raises ``GrammarError`` when it is not allowed)."""
        ...


TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data), "llama_token_data changed"


def mask_candidates(view: NDArray[np.void], allowed: NDArray[np.bool_]) -> None:
    """Set the logit of every candidate in ``view`` (``llama_token_data`` records) whose id
    ``allowed`` refuses to -inf. Raises ``GrammarError`` when none is left."""
    ids = view["id"]
    if ids.size == allowed.size and ids[0] == 0 and ids[-1] == ids.size - 1:
        # llama.cpp lays the candidates out in id order, and the samplers before this one
        # in bmoe's chain (logit biases, penalties) change logits, not the order
        keep = allowed
    else:
        inside = ids < allowed.size
        keep = np.zeros(ids.size, dtype=bool)
        keep[inside] = allowed[ids[inside]]
    np.copyto(view["logit"], -np.inf, where=~keep)
    if not keep.any():
        raise GrammarError("the constraint allows no token of this vocabulary here")


class MaskSampler:
    """Build with the mask, add ``pointer`` to a chain (which then owns and frees it) and keep
    this object alive as long as the chain: its callbacks live here."""

    NAME = b"bmoe-mask"

    def __init__(self, mask: ITokenMask) -> None:
        self.mask = mask
        self.failure: BaseException | None = None
        self._callbacks = (
            llama_cpp.llama_sampler_i_name(lambda _s: self.NAME),
            llama_cpp.llama_sampler_i_accept(self._accept),
            llama_cpp.llama_sampler_i_apply(self._apply),
        )
        iface = llama_cpp.llama_sampler_i()
        iface.name, iface.accept, iface.apply = self._callbacks
        self._iface = iface  # the chain's sampler points at it: it must outlive the chain
        self.pointer = llama_cpp.llama_sampler_init(ctypes.pointer(iface), None)

    def _apply(self, _smpl: object, cur_p: Any) -> None:  # a llama_token_data_array pointer
        try:
            array = cur_p.contents
            view = np.ctypeslib.as_array(
                ctypes.cast(array.data, ctypes.POINTER(ctypes.c_uint8)), (array.size * TOKEN_DATA.itemsize,)
            ).view(TOKEN_DATA)
            mask_candidates(view, self.mask.allowed())
        except BaseException as exc:
            self.failure = self.failure or exc

    def _accept(self, _smpl: object, token: int) -> None:
        try:
            self.mask.accept(int(token))
        except BaseException as exc:
            self.failure = self.failure or exc

    def check(self) -> None:
        """Raise what a callback met, if anything."""
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
