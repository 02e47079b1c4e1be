"""The protocol's own error, split from a client's bad line by who is at fault.

A bad *request* line is the remote side's fault and never raises: the reader turns it into a
``BadRequest`` event that the session answers with a non-fatal ``BMOE_ERROR``. A bad
*response* line (read by a client with ``ResponseReader``) means the engine broke the
contract, and that raises ``ProtocolError``. Building an event with bad values in Python
raises ``bmoe.errors.ConfigError`` (a bad value) or ``TypeError`` (a wrong type).
"""

from __future__ import annotations

from bmoe.errors import BmoeError


class ProtocolError(BmoeError, ValueError):
    """A response line that does not follow the protocol (unknown tag, bad JSON, bad field),
    or a reader used after its end of input."""
