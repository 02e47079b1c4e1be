"""Anthropic's Messages API routes: ``POST /v1/messages`` (whole or streamed) and
``POST /v1/messages/count_tokens``, answering errors in Anthropic's shape.

A request is read into the neutral ``ChatRequest`` (``messages_requests``) and runs as a
chat completion does (the same queue, cancel on disconnect, stop strings, tools and
constraints); its answer is written by ``MessagesWriter``. The ``anthropic-version`` and
``anthropic-beta`` headers are accepted and change nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bmoe.domain.media.references import INLINE_MEDIA, MediaPolicy
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.errors import api_error
from bmoe.serve.http_jobs import (
    Done,
    Json,
    Pieces,
    answering_errors,
    dumps,
    first_piece,
    job_result,
    json_response,
    off_loop_if,
    pieces_then_outcome,
    read_json_body,
)
from bmoe.serve.messages_replies import MessagesWriter, error_event, new_message_id
from bmoe.serve.messages_requests import MessagesRequest, count_tokens_body, parse_messages
from bmoe.serve.service import ServedSession
from bmoe.serve.worker import Job


def _event(body: Json) -> ServerSentEvent:
    return ServerSentEvent(data=dumps(body), event=str(body["type"]))


async def _events(
    first: Delta | Done, pieces: Pieces, job: Job[Outcome], writer: MessagesWriter
) -> AsyncIterator[ServerSentEvent]:
    try:
        for event in writer.start():
            yield _event(event)
        async for item in pieces_then_outcome(first, pieces, job):
            if isinstance(item, Delta):
                events = writer.delta(item)
            elif isinstance(item, Outcome):
                events = writer.finish(item)
            else:
                events = [error_event(api_error(item))]
            for event in events:
                yield _event(event)
    finally:
        job.cancel()  # the stream closed early: the client went away


def messages_routes(served: ServedSession, media: MediaPolicy = INLINE_MEDIA) -> list[Route]:
    """The routes of the Messages API over ``served``, its images as ``media`` allows."""

    async def read(request: Request, *, counting: bool = False) -> MessagesRequest:
        body = await read_json_body(request)
        return await off_loop_if(
            media.reaches_out, lambda: parse_messages(body, counting=counting, media=media)
        )

    async def create(request: Request) -> Response:
        asked = await read(request)
        pieces = Pieces()
        job = served.chat(asked.chat, pieces.emit)
        writer = MessagesWriter(new_message_id(), asked.model or served.model_id)
        if not asked.chat.generation.stream:
            return json_response(writer.whole(await job_result(request, job)))
        first = await first_piece(request, job, pieces)
        return EventSourceResponse(
            _events(first, pieces, job, writer),
            sep="\n",
            ping_message_factory=lambda: _event({"type": "ping"}),
        )

    async def count(request: Request) -> Response:
        asked = await read(request, counting=True)
        n = await asyncio.to_thread(served.prompt_tokens, asked.chat)
        return json_response(count_tokens_body(n))

    return [
        Route("/v1/messages", answering_errors(create, "anthropic"), methods=["POST"]),
        Route("/v1/messages/count_tokens", answering_errors(count, "anthropic"), methods=["POST"]),
    ]
