"""An OpenAI-compatible HTTP server over one bmoe session: ``python -m bmoe.serve``.

Pure parts (no HTTP, no model), unit-tested on their own:

- ``fields``: strict readers of JSON request fields, naming the field that is wrong;
- ``neutral``: the one chat request and the one result every dialect maps to;
- ``api_requests``: the request values of ``/v1/chat/completions``, ``/v1/completions`` and
  ``/v1/decide``, parsed from JSON; ``responses_requests`` and ``messages_requests``: the
  Responses API's and Anthropic's Messages API's bodies, read into the neutral request;
- ``mapping``: those requests as bmoe's ``GenerateRequest`` / ``SamplingParams`` and the
  conversation (``ChatTurn``);
- ``stop``: stop strings over streamed text (``StopScanner``);
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
