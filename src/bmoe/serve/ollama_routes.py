"""Ollama's API routes: ``POST /api/chat`` and ``POST /api/generate`` (streamed as one JSON
object a line unless ``stream`` is false), ``GET /api/tags``, ``POST /api/show``, ``GET
/api/ps``, ``GET /api/version``, answering errors in Ollama's shape (``{"error": "..."}``).

A request is read into the neutral ``ChatRequest`` (``ollama_requests``) and runs as a chat
completion does (the same queue, cancel on disconnect, stop strings, tools and constraints);
its answer is written by ``OllamaWriter``. The model it names must be the one served
(``same_model``: its id, with or without ``:latest``), else 404 ``model 'x' not found``, as
Ollama answers. Ollama's model management (``pull``, ``push``, ``create``, ``copy``,
``delete``, ``blobs``) and embeddings (``embed``, ``embeddings``) are answered 501 with a
sentence saying so; any other ``/api/`` path 404.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import AsyncIterator, Callable

import gguf
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from bmoe.domain.media.references import INLINE_MEDIA, MediaPolicy
from bmoe.errors import RequestError
from bmoe.requests.fields import Body
from bmoe.requests.neutral import Delta, Outcome
from bmoe.serve.errors import NotFoundError, NotServedError, api_error
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
from bmoe.serve.ollama_replies import ModelFacts, OllamaWriter, not_found, version_body
from bmoe.serve.ollama_requests import OllamaRequest, parse_chat, parse_generate, same_model, tagged_name
from bmoe.serve.service import ServedSession
from bmoe.serve.worker import Job

NDJSON = "application/x-ndjson"
NOT_SERVED = {
    "/api/pull": ["POST"],
    "/api/push": ["POST"],
    "/api/create": ["POST"],
    "/api/copy": ["POST"],
    "/api/delete": ["DELETE"],
    "/api/blobs/{digest}": ["HEAD", "POST"],
    "/api/embed": ["POST"],
    "/api/embeddings": ["POST"],
}


def model_facts(served: ServedSession) -> ModelFacts:
    """What Ollama's listings say of the served model, read from its session and file."""
    session = served.session
    path = session.config.model_path
    stat = path.stat()
    name = tagged_name(served.model_id)
    file_type = session.model.meta("general.file_type")
    try:
        quant = gguf.LlamaFileType(int(file_type or "")).name.removeprefix("MOSTLY_")
    except ValueError:
        quant = "unknown"
    capabilities = ["completion"]
    if session.engine.renderer.tool_format is not None:
        capabilities.append("tools")
    if session.vision is not None:
        capabilities.append("vision")
    if session.think_ctl:
        capabilities.append("thinking")
    modified = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stat.st_mtime))
    return ModelFacts(
        name=name,
        size=stat.st_size,
        modified_at=modified,
        digest=hashlib.sha256(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest(),
        family=session.arch,
        parameter_count=session.model.n_params,
        quantization_level=quant,
        context_length=session.n_ctx,
        template=session.template.source,
        capabilities=tuple(capabilities),
    )


async def _lines(
    first: Delta | Done, pieces: Pieces, job: Job[Outcome], writer: OllamaWriter
) -> AsyncIterator[str]:
    try:
        async for item in pieces_then_outcome(first, pieces, job):
            if isinstance(item, Delta):
                bodies = writer.delta(item)
            elif isinstance(item, Outcome):
                bodies = writer.finish(item)
            else:
                bodies = [api_error(item).ollama_body()]
            for body in bodies:
                yield dumps(body) + "\n"
    finally:
        job.cancel()  # the stream closed early: the client went away


def _one_line(body: Json) -> StreamingResponse:
    async def line() -> AsyncIterator[str]:
        yield dumps(body) + "\n"

    return StreamingResponse(line(), media_type=NDJSON)


def ollama_routes(served: ServedSession, media: MediaPolicy = INLINE_MEDIA) -> list[Route]:
    """The routes of Ollama's API over ``served``."""
    facts = functools.cache(lambda: model_facts(served))

    def check_model(name: str) -> None:
        if not same_model(name, served.model_id):
            raise NotFoundError(not_found(name), "model")

    async def answer(
        request: Request, parse: Callable[[Body, MediaPolicy], OllamaRequest], chat: bool
    ) -> Response:
        started = time.perf_counter_ns()
        body = await read_json_body(request)
        asked = await off_loop_if(media.reaches_out, lambda: parse(body, media))
        check_model(asked.model)
        generation = asked.chat.generation if asked.chat is not None else None
        logprobs = generation is not None and generation.logprobs is not None
        writer = OllamaWriter(asked.model, chat=chat, started_ns=started, logprobs=logprobs)
        if asked.probe is not None:
            probe = writer.probe(asked.probe)
            return _one_line(probe) if asked.stream else json_response(probe)
        pieces = Pieces()
        if asked.chat is not None:
            job = served.chat(asked.chat, pieces.emit)
        else:
            assert asked.raw is not None
            job = served.complete(asked.raw, pieces.emit)
        if not asked.stream:
            return json_response(writer.whole(await job_result(request, job)))
        first = await first_piece(request, job, pieces)
        return StreamingResponse(_lines(first, pieces, job, writer), media_type=NDJSON)

    async def chat(request: Request) -> Response:
        return await answer(request, parse_chat, True)

    async def generate(request: Request) -> Response:
        return await answer(request, parse_generate, False)

    async def tags(_: Request) -> Response:
        return json_response(facts().tags_body())

    async def show(request: Request) -> Response:
        body = await read_json_body(request)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise RequestError("'model' is required", "model")
        check_model(name)
        return json_response(facts().show_body())

    async def ps(_: Request) -> Response:
        return json_response(facts().ps_body())

    async def version(_: Request) -> Response:
        return json_response(version_body())

    async def not_served(request: Request) -> Response:
        path = request.url.path
        why = (
            "bmoe generates text and serves no embeddings"
            if path.startswith("/api/embed")
            else "bmoe serves the one model it loaded at start (python -m bmoe.serve -m MODEL.gguf)"
        )
        raise NotServedError(f"{path} is not served: {why}")

    async def unknown(request: Request) -> Response:
        return json_response({"error": f"{request.url.path}: 404 page not found"}, 404)

    routes = [
        Route("/api/chat", answering_errors(chat, "ollama"), methods=["POST"]),
        Route("/api/generate", answering_errors(generate, "ollama"), methods=["POST"]),
        Route("/api/tags", answering_errors(tags, "ollama"), methods=["GET"]),
        Route("/api/show", answering_errors(show, "ollama"), methods=["POST"]),
        Route("/api/ps", answering_errors(ps, "ollama"), methods=["GET"]),
        Route("/api/version", answering_errors(version, "ollama"), methods=["GET"]),
    ]
    routes += [
        Route(path, answering_errors(not_served, "ollama"), methods=m) for path, m in NOT_SERVED.items()
    ]
    return [*routes, Route("/api/{rest:path}", unknown)]
