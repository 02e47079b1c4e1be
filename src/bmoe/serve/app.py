"""The HTTP side: Starlette routes over a ``ServedSession``.

- ``GET /v1/models``, ``GET /v1/models/{id}``;
- ``POST /v1/chat/completions`` and ``POST /v1/completions``, answered whole or, with
  ``"stream": true``, as server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``);
- ``POST /v1/decide``: bmoe's decisions;
- ``GET /`` (the web page), ``GET /v1/bmoe/metrics`` (the live engine feed): ``page``.
- the Responses API (``responses_routes``), Anthropic's Messages API (``messages_routes``),
  Ollama's API (``ollama_routes``) and llama.cpp's service endpoints (``service_routes``);
- all of it behind ``guards`` (the API key, the body limit).

Each request's work is queued on the session's worker; the handler waits for it without
blocking the event loop. A client that goes away cancels its request (queued or running).
A streamed request starts its stream once the first piece is out (or the request
finished), so a request the session refuses (a prompt past the context) is still answered
with its HTTP status; an error after that ends the stream with an ``error`` event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bmoe.domain.media.references import MediaPolicy
from bmoe.requests.api_requests import parse_chat_completion, parse_completion, parse_decide
from bmoe.requests.neutral import Delta, Generation, Outcome
from bmoe.serve import api_responses as api
from bmoe.serve.api_responses import Envelope, Json
from bmoe.serve.errors import api_error
from bmoe.serve.flags import HttpOptions
from bmoe.serve.guards import MIB, Guards, default_max_body
from bmoe.serve.http_jobs import (
    Done,
    Pieces,
    answering_errors,
    dumps,
    error_response,
    first_piece,
    job_result,
    json_response,
    off_loop_if,
    pieces_then_outcome,
    read_json_body,
)
from bmoe.serve.messages_routes import messages_routes
from bmoe.serve.ollama_routes import ollama_routes
from bmoe.serve.page import page_routes
from bmoe.serve.response_store import ResponseStore
from bmoe.serve.responses_routes import responses_routes
from bmoe.serve.service import ServedSession, new_id
from bmoe.serve.service_routes import service_routes
from bmoe.serve.worker import Job


def build_app(served: ServedSession, options: HttpOptions | None = None) -> Guards:
    """The ASGI application serving ``served``, behind its key check and body limit."""
    options = options or HttpOptions()
    mb = options.max_body_mb
    max_body = default_max_body(served.session.n_ctx) if mb is None else max(1, int(mb * MIB))
    media = MediaPolicy(
        allow_remote=options.allow_remote_media,
        allow_private=options.allow_private_media,
        media_path=options.media_path,
        max_bytes=max_body,
    )

    def envelope(prefix: str) -> Envelope:
        return Envelope(id=new_id(prefix), created=int(time.time()), model=served.model_id)

    async def models(_: Request) -> Response:
        return json_response(api.model_list(served.card))

    async def model(request: Request) -> Response:
        if request.path_params["model"] != served.model_id:
            raise HTTPException(404, f"the model '{request.path_params['model']}' does not exist")
        return json_response(served.card.body())

    async def chat_completions(request: Request) -> Response:
        body = await read_json_body(request)
        asked = await off_loop_if(media.reaches_out, lambda: parse_chat_completion(body, media))
        pieces = Pieces()
        job = served.chat(asked, pieces.emit)
        return await _answer(request, job, pieces, asked.generation, envelope("chatcmpl"), chat=True)

    async def completions(request: Request) -> Response:
        asked = parse_completion(await read_json_body(request))
        pieces = Pieces()
        job = served.complete(asked, pieces.emit)
        return await _answer(request, job, pieces, asked.generation, envelope("cmpl"), chat=False)

    async def decide(request: Request) -> Response:
        body = await read_json_body(request)
        asked = await off_loop_if(media.reaches_out, lambda: parse_decide(body, media))
        job = served.decide(asked)
        result = await job_result(request, job)
        return json_response(api.decision(envelope("decision"), asked, result))

    async def http_error(_: Request, exc: Exception) -> Response:
        return error_response(exc)

    routes = [
        Route("/v1/models", answering_errors(models), methods=["GET"]),
        Route("/v1/models/{model:path}", answering_errors(model), methods=["GET"]),
        Route("/v1/chat/completions", answering_errors(chat_completions), methods=["POST"]),
        Route("/v1/completions", answering_errors(completions), methods=["POST"]),
        Route("/v1/decide", answering_errors(decide), methods=["POST"]),
        *responses_routes(served, ResponseStore(), media),
        *messages_routes(served, media),
        *ollama_routes(served, media),
        *service_routes(served, metrics=options.metrics),
        *page_routes(served),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    return Guards(app, api_keys=options.api_keys, max_body=max_body)


async def _answer(
    request: Request, job: Job[Outcome], pieces: Pieces, gen: Generation, env: Envelope, *, chat: bool
) -> Response:
    if not gen.stream:
        result = await job_result(request, job)
        return json_response(api.chat_completion(env, result) if chat else api.text_completion(env, result))
    first = await first_piece(request, job, pieces)
    events = (_chat_events if chat else _text_events)(first, pieces, job, env, gen)
    return EventSourceResponse(events, sep="\n")


def _event(body: Json | str) -> ServerSentEvent:
    return ServerSentEvent(data=dumps(body))


async def _chat_events(
    first: Delta | Done, pieces: Pieces, job: Job[Outcome], env: Envelope, gen: Generation
) -> AsyncIterator[ServerSentEvent]:
    calls = 0
    try:
        yield _event(api.chat_chunk(env, {"role": "assistant", "content": ""}))
        async for item in pieces_then_outcome(first, pieces, job):
            if isinstance(item, Delta):
                logprobs = api.chat_logprobs(item.logprobs) if gen.logprobs is not None else None
                yield _event(api.chat_chunk(env, api.chat_delta(item, calls), None, logprobs))
                calls += len(item.tool_calls)
            elif isinstance(item, Outcome):
                yield _event(api.chat_chunk(env, {}, item.finish_reason))
                if gen.include_usage:
                    yield _event(api.usage_chunk(env, "chat.completion.chunk", item))
            else:
                yield _event(api_error(item).body())
        yield _event("[DONE]")
    finally:
        job.cancel()  # the stream closed early: the client went away


async def _text_events(
    first: Delta | Done, pieces: Pieces, job: Job[Outcome], env: Envelope, gen: Generation
) -> AsyncIterator[ServerSentEvent]:
    offset = 0
    try:
        async for item in pieces_then_outcome(first, pieces, job):
            if isinstance(item, Delta):
                logprobs = api.text_logprobs(item.logprobs, offset) if gen.logprobs is not None else None
                yield _event(api.text_chunk(env, item, None, logprobs))
                offset += sum(len(lp.chosen.piece) for lp in item.logprobs)
            elif isinstance(item, Outcome):
                yield _event(api.text_chunk(env, Delta(), item.finish_reason))
                if gen.include_usage:
                    yield _event(api.usage_chunk(env, "text_completion", item))
            else:
                yield _event(api_error(item).body())
        yield _event("[DONE]")
    finally:
        job.cancel()  # the stream closed early: the client went away
