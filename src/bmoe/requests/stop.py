"""Stop strings over text that arrives in pieces.

Generation must stop at the first stop string and the text be cut there, but a stop string
may arrive split across tokens (``"\\n\\n"`` as two ``"\\n"``). ``StopScanner`` holds back any
tail that could still begin a stop string, as ``ReasoningSplitter`` holds back a tail that
could still become a tag, so what it lets out is never taken back.
"""

from __future__ import annotations

import attrs


def _held_tail(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    longest = max((len(s) for s in stops), default=1)
    for n in range(min(longest - 1, len(text)), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0


@attrs.define
class StopScanner:
    """Feed the answer's pieces with ``feed()``, then ``finish()``.

    Each call returns the text that is final: the pieces, in order, less what could still
    begin a stop string. Once a stop string is complete, ``stopped`` is true, the text up to
    it is returned and every later piece is dropped (``matched`` is the stop string that
    ended it: the earliest in the text, the longest of those beginning there). With no stop
    strings, every piece goes through as it came.
    """

    stops: tuple[str, ...]
    stopped: bool = False
    matched: str | None = None
    _held: str = ""

    def __attrs_post_init__(self) -> None:
        if any(not s for s in self.stops):
            raise ValueError("a stop string must not be empty")

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        text = self._held + piece
        hits = [(at, -len(s), s) for s in self.stops if (at := text.find(s)) >= 0]
        if hits:
            at, _, self.matched = min(hits)
            self.stopped, self._held = True, ""
            return text[:at]
        keep = _held_tail(text, self.stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def finish(self) -> str:
        """What was held back (it never became a stop string)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
