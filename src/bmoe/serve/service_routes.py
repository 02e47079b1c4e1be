"""llama.cpp's server's service endpoints, with its names and shapes where it has them:

- ``GET /health``: ``{"status": "ok"}``; 503 once the session ended after a fatal error
  (the server listens only once the model is loaded, so there is no "loading" state);
- ``POST /tokenize`` (``content``, ``add_special`` default false, ``parse_special`` default
  true, ``with_pieces``) and ``POST /detokenize`` (``tokens``);
- ``GET /props``: the generation defaults, the context, the slots, the chat template, the
  build;
- ``GET /slots``: each slot's state (and, one request at a time, the tokens its KV holds);
- ``GET /metrics`` (with ``--metrics``): Prometheus' text format (``prometheus``).

Tokenizing runs on the caller's thread (the vocabulary only, no compute), so it never waits
for a generation.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

import bmoe
from bmoe.errors import BmoeError, RequestError
from bmoe.requests.fields import Body, opt_bool
from bmoe.serve.http_jobs import answering_errors, json_response, read_json_body
from bmoe.serve.prometheus import prometheus_text
from bmoe.serve.service import ServedSession

MAX_DETOKENIZE = 1 << 20  # tokens in one /detokenize request


def service_routes(served: ServedSession, *, metrics: bool) -> list[Route]:
    """The service routes over ``served`` (``/metrics`` only when ``metrics``)."""
    session = served.session
    model = session.model

    async def health(_: Request) -> Response:
        failed = session.engine.failed
        if failed is not None:
            error = {"code": 503, "message": f"the session ended: {failed}", "type": "unavailable_error"}
            return json_response({"error": error}, 503)
        return json_response({"status": "ok"})

    def tokenize_body(body: Body) -> dict[str, object]:
        content = body.get("content")
        if not isinstance(content, str):
            raise RequestError("'content' must be a string", "content")
        add_special = bool(opt_bool(body, "add_special"))
        parse_special = opt_bool(body, "parse_special")
        tokens = model.tokenize(content, add_special=add_special, parse_special=parse_special is not False)
        if not opt_bool(body, "with_pieces"):
            return {"tokens": tokens}
        pieces = []
        for token in tokens:
            raw = model.token_bytes(token, special=True)
            try:
                piece: str | list[int] = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)  # a part of a character: its bytes, as llama.cpp gives them
            pieces.append({"id": token, "piece": piece})
        return {"tokens": pieces}

    async def tokenize(request: Request) -> Response:
        body = await read_json_body(request)
        return json_response(await asyncio.to_thread(tokenize_body, body))

    def detokenize_body(body: Body) -> dict[str, object]:
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or len(tokens) > MAX_DETOKENIZE:
            raise RequestError(f"'tokens' must be a list of at most {MAX_DETOKENIZE} token ids", "tokens")
        for i, token in enumerate(tokens):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < model.n_vocab:
                raise RequestError(f"tokens[{i}] must be a token id in [0, {model.n_vocab})", f"tokens[{i}]")
        raw = b"".join(model.token_bytes(t, special=True) for t in tokens)
        return {"content": raw.decode("utf-8", errors="replace")}

    async def detokenize(request: Request) -> Response:
        body = await read_json_body(request)
        return json_response(await asyncio.to_thread(detokenize_body, body))

    async def props(_: Request) -> Response:
        sampling = served.defaults.sampling
        n_slots = max(1, served.parallel)
        params = {
            "temperature": sampling.temp,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "n_predict": -1 if served.defaults.max_tokens is None else served.defaults.max_tokens,
        }
        body = {
            "default_generation_settings": {"n_ctx": session.n_ctx // n_slots, "params": params},
            "total_slots": n_slots,
            "model_alias": served.model_id,
            "model_path": str(session.config.model_path),
            "n_ctx": session.n_ctx,
            "chat_template": session.config.chat_template or model.chat_template or "",
            "modalities": {"vision": False, "audio": False},
            "build_info": f"bmoe {bmoe.__version__} (llama.cpp through llama-cpp-python)",
            "bmoe": served.card.meta,
        }
        stream = session.config.stream
        if stream.enabled:  # the planner's figures for the loaded model (python -m bmoe.plan --json)
            key = (str(session.config.model_path), session.n_ctx, n_slots, stream.cache_mb)
            body["plan"] = await asyncio.to_thread(loaded_model_plan, *key)
        return json_response(body)

    async def slots(_: Request) -> Response:
        total, busy, _waiting = served.slots()
        kept = session.slot_tokens if total > 1 else (len(session.engine.kv_tokens),)
        cached = kept or (0,) * total  # with -np: what each slot's KV keeps between runs
        n_ctx = session.n_ctx // total
        return json_response(
            [
                {"id": i, "n_ctx": n_ctx, "is_processing": i < busy, "tokens_cached": cached[i]}
                for i in range(total)
            ]
        )

    async def prometheus(_: Request) -> Response:
        if not metrics:
            raise HTTPException(404, "start the server with --metrics to serve /metrics")
        _total, busy, waiting = served.slots()
        text = prometheus_text(served.totals, busy, waiting, served.streaming, served.drafting)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return [
        Route("/health", health, methods=["GET"]),
        Route("/tokenize", answering_errors(tokenize), methods=["POST"]),
        Route("/detokenize", answering_errors(detokenize), methods=["POST"]),
        Route("/props", answering_errors(props), methods=["GET"]),
        Route("/slots", answering_errors(slots), methods=["GET"]),
        Route("/metrics", answering_errors(prometheus), methods=["GET"]),
    ]


@functools.cache
def loaded_model_plan(path: str, n_ctx: int, n_parallel: int, cache_mb: int | None) -> dict[str, Any]:
    """``/props``'s ``plan``: the plan of the loaded model in this server's context, made once
    (its disk and compute measures included); ``{"error": ...}`` where it cannot be made."""
    from bmoe.domain.plan.document import to_json
    from bmoe.domain.plan.predict import PlanSettings
    from bmoe.runtime.planning import MachineOptions, plan_local

    settings = PlanSettings(n_ctx=n_ctx, cache_mb=cache_mb, n_parallel=n_parallel)
    try:
        planned = plan_local(Path(path), settings, MachineOptions())
    except (BmoeError, OSError) as exc:
        return {"error": str(exc)}
    return to_json(planned.plan, planned.source)
