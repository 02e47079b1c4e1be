"""Events in, response lines out: ``TAG {json}\\n``, one per event, without I/O.

The JSON is compact (no spaces), keeps non-ASCII text as UTF-8, lists keys in the order of
docs/protocol.md, and writes a float that is NaN or infinite as ``null`` (so a choice whose
log-probability is minus infinity is ``null``). A line never holds a raw line break: JSON
escapes ``\\n`` and ``\\r`` in strings, and the writer also escapes U+0085, U+2028 and U+2029,
which some line splitters (Python's ``str.splitlines`` among them) take for one. A lone
surrogate in a string (what ``surrogateescape`` makes of bytes that are not UTF-8) is written
as its ``\\udXXX`` escape rather than failing, and reads back as the same surrogate; a high and
a low surrogate side by side read back as the one character they encode.
"""

from __future__ import annotations

import json

from bmoe.adapters.protocol.converter import response_to_json
from bmoe.adapters.protocol.responses import Response

_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def encode_response(event: Response) -> bytes:
    """The line for ``event``, ``\\n`` included, as UTF-8."""
    body = json.dumps(response_to_json(event), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    line = f"{event.TAG} {body.translate(_LINE_BREAKS)}\n"
    # A lone surrogate cannot be UTF-8; "backslashreplace" spells it \udXXX, a JSON escape.
    return line.encode("utf-8", errors="backslashreplace")
