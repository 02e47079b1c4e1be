"""The Responses API's routes: ``POST /v1/responses`` (whole or streamed),
``GET``/``DELETE /v1/responses/{id}`` and ``POST /v1/responses/input_tokens``.

A request is read into the neutral ``ChatRequest`` (``responses_requests``), continuing the
stored conversation its ``previous_response_id`` names, and runs as a chat completion does
(the same queue, cancel on disconnect, stop strings, tools and constraints); its answer is
written by ``ResponsesWriter``. With ``store`` (the default) the response is kept
(``ResponseStore``) once it is complete.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bmoe.domain.chat import ChatMessage
from bmoe.domain.media.references import INLINE_MEDIA, MediaPolicy
from bmoe.requests.neutral import ChatRequest, Delta, Outcome
from bmoe.serve.api_responses import Envelope
from bmoe.serve.errors import NotFoundError, api_error
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
from bmoe.serve.response_store import ResponseStore, StoredResponse
from bmoe.serve.responses_replies import ResponsesWriter, deleted, input_tokens, new_item_id
from bmoe.serve.responses_requests import ResponsesRequest, parse_responses
from bmoe.serve.service import ServedSession
from bmoe.serve.worker import Job


class _Turn:
    """One ``/v1/responses`` request: what it asked, the conversation it continues, and
    where its response is kept."""

    def __init__(self, asked: ResponsesRequest, store: ResponseStore) -> None:
        self.asked = asked
        self.store = store
        self.earlier: tuple[ChatMessage, ...] = ()
        previous = self.asked.previous_response_id
        if previous is not None:
            kept = store.get(previous)
            if kept is None:
                raise NotFoundError(f"no response '{previous}' is stored here", "previous_response_id")
            self.earlier = kept.conversation
        self.chat: ChatRequest = self.asked.chat(self.earlier)

    def keep(self, body: Json, o: Outcome) -> None:
        if self.asked.store:
            answer = ChatMessage("assistant", o.text, o.reasoning, o.tool_calls)
            self.store.put(body["id"], StoredResponse(body, (*self.earlier, *self.asked.input, answer)))


def _event(body: Json) -> ServerSentEvent:
    return ServerSentEvent(data=dumps(body), event=str(body["type"]))


async def _events(
    first: Delta | Done, pieces: Pieces, job: Job[Outcome], writer: ResponsesWriter, turn: _Turn
) -> AsyncIterator[ServerSentEvent]:
    try:
        for event in writer.start():
            yield _event(event)
        async for item in pieces_then_outcome(first, pieces, job):
            if isinstance(item, Delta):
                events = writer.delta(item)
            elif isinstance(item, Outcome):
                events = writer.finish(item)
                turn.keep(writer.response, item)
            else:
                events = writer.fail(api_error(item))
            for event in events:
                yield _event(event)
    finally:
        job.cancel()  # the stream closed early: the client went away


def responses_routes(
    served: ServedSession, store: ResponseStore, media: MediaPolicy = INLINE_MEDIA
) -> list[Route]:
    """The routes of the Responses API over ``served``, keeping responses in ``store``, its
    images as ``media`` allows."""

    async def turn_of(request: Request) -> _Turn:
        body = await read_json_body(request)
        asked = await off_loop_if(media.reaches_out, lambda: parse_responses(body, media))
        return _Turn(asked, store)

    def envelope() -> Envelope:
        return Envelope(id=new_item_id("resp"), created=int(time.time()), model=served.model_id)

    async def create(request: Request) -> Response:
        turn = await turn_of(request)
        pieces = Pieces()
        job = served.chat(turn.chat, pieces.emit)
        writer = ResponsesWriter(envelope(), turn.asked)
        if not turn.asked.generation.stream:
            o = await job_result(request, job)
            body = writer.whole(o)
            turn.keep(body, o)
            return json_response(body)
        first = await first_piece(request, job, pieces)
        return EventSourceResponse(_events(first, pieces, job, writer, turn), sep="\n")

    def kept(request: Request) -> StoredResponse:
        response_id = request.path_params["response_id"]
        stored = store.get(response_id)
        if stored is None:
            raise NotFoundError(f"no response '{response_id}' is stored here", "response_id")
        return stored

    async def retrieve(request: Request) -> Response:
        return json_response(kept(request).body)

    async def delete(request: Request) -> Response:
        kept(request)
        store.delete(request.path_params["response_id"])
        return json_response(deleted(request.path_params["response_id"]))

    async def count(request: Request) -> Response:
        turn = await turn_of(request)
        n = await asyncio.to_thread(served.prompt_tokens, turn.chat)
        return json_response(input_tokens(n))

    return [
        Route("/v1/responses", answering_errors(create), methods=["POST"]),
        Route("/v1/responses/input_tokens", answering_errors(count), methods=["POST"]),
        Route("/v1/responses/{response_id}", answering_errors(retrieve), methods=["GET"]),
        Route("/v1/responses/{response_id}", answering_errors(delete), methods=["DELETE"]),
    ]
