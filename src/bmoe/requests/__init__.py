"""The request core: OpenAI-shaped requests read, mapped to bmoe's and answered, with no HTTP
and no session, so that the server (``bmoe.serve``), llama-cpp-python's ``Llama``
(``bmoe.llama_compat``) and ``Session.chat`` (``bmoe.runtime.chat_requests``) read one
request alike:

- ``fields``: strict readers of JSON request fields, naming the field that is wrong (each
  failure a ``bmoe.errors.RequestError``);
- ``neutral``: the one chat request (``ChatRequest``) and the one result (``Outcome``, its
  streamed pieces ``Delta``) every dialect maps to;
- ``api_requests`` with ``api_tools``: the bodies of ``/v1/chat/completions``,
  ``/v1/completions`` and ``/v1/decide`` parsed into values; ``chat_fields``: a chat body's
  fields as ``Session.chat``'s keyword arguments (``ChatFields``) and back into the body;
- ``mapping``: those requests as bmoe's ``GenerateRequest`` / ``SamplingParams`` and the
  conversation (``ChatTurn``);
- ``stop``: stop strings over streamed text (``StopScanner``); ``reply``: one generation's
  reply as it streams, cut at stop strings and read for tool calls (``ReplyStream``), and its
  ``Outcome``.

The server's dialects (``bmoe.serve``: the Responses API, Anthropic's Messages API) read
their bodies into the same ``ChatRequest``; writing a result as JSON is theirs.
"""
