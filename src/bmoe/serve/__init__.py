"""An OpenAI-compatible HTTP server over one bmoe session: ``python -m bmoe.serve``.

Pure parts (no HTTP, no model), unit-tested on their own, beside the request core they
share with the library (``bmoe.requests``: the fields, the neutral request and result, the
chat-completions bodies, the mapping to bmoe's requests, stop strings and the reply stream):

- ``responses_requests`` and ``messages_requests``: the Responses API's and Anthropic's
  Messages API's bodies, read into the neutral request;
- ``api_responses``, ``responses_replies``, ``messages_replies``: each dialect's bodies and
  stream events, from the neutral result; ``response_store``: the stored responses;
- ``prometheus``: the server's totals and ``/metrics``;
- ``errors``: bmoe's errors as OpenAI's error body and an HTTP status.

Around them: ``worker`` (one thread running requests one at a time, each cancellable),
``service`` (a session's turns on that worker), ``app`` (the Starlette routes, server-sent
events, cancel on disconnect) with ``http_jobs`` (what the handlers share),
``responses_routes``, ``messages_routes`` and ``service_routes``, ``guards`` (API keys, the
body limit), ``flags`` and ``main`` (the command line). The HTTP stack
(Starlette, uvicorn, sse-starlette) is the ``server`` extra:
``.venv/bin/pip install -e '.[server]'`` from a checkout.
"""
