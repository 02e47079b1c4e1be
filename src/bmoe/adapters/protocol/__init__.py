"""The session line protocol, sans I/O (docs/protocol.md).

Bytes in, events out; events in, bytes out. Nothing here reads stdin, writes stdout, starts
a thread or touches llama.cpp: the session loop around it does, and stays thin.

Session side::

    reader = RequestReader()
    for event in reader.feed(chunk):            # ... and reader.feed_eof() at end of input
        match event:
            case GenerateCmd() | DecideCmd(): ...           # run it
            case CancelCmd(): ...                           # cancel the one in flight
            case CloseCmd() | EndOfInput(): ...             # end the session
            case BadRequest(id=rid, msg=msg):
                out.write(encode_response(Error(id=rid, fatal=False, msg=msg)))

Client side: ``ResponseReader().feed(chunk)`` gives back ``Ready``, ``Begin``, ``Progress``,
``Done``, ``DecideDone`` and ``Error`` events, and raises ``ProtocolError`` on a bad line.
"""

from bmoe.adapters.protocol.checks import RequestId
from bmoe.adapters.protocol.errors import ProtocolError
from bmoe.adapters.protocol.reader import DEFAULT_MAX_LINE_BYTES, RequestReader, parse_request
from bmoe.adapters.protocol.requests import (
    BadRequest,
    CancelCmd,
    CloseCmd,
    DecideCmd,
    EndOfInput,
    GenerateCmd,
    ReaderEvent,
    Request,
)
from bmoe.adapters.protocol.response_reader import ResponseReader, parse_response
from bmoe.adapters.protocol.responses import (
    NOT_MEASURED,
    Begin,
    DecideDone,
    Done,
    DoneLogprob,
    DoneToolCall,
    Error,
    Progress,
    ProgressBudgetChange,
    Ready,
    Response,
)
from bmoe.adapters.protocol.writer import encode_response

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "NOT_MEASURED",
    "BadRequest",
    "Begin",
    "CancelCmd",
    "CloseCmd",
    "DecideCmd",
    "DecideDone",
    "Done",
    "DoneLogprob",
    "DoneToolCall",
    "EndOfInput",
    "Error",
    "GenerateCmd",
    "Progress",
    "ProgressBudgetChange",
    "ProtocolError",
    "ReaderEvent",
    "Ready",
    "Request",
    "RequestId",
    "RequestReader",
    "Response",
    "ResponseReader",
    "encode_response",
    "parse_request",
    "parse_response",
]
