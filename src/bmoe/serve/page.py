"""The web page (``GET /``, its script and style under ``/web/``) and the live metrics feed
(``GET /v1/bmoe/metrics``, server-sent events).

The page is plain HTML, CSS and JavaScript shipped in ``bmoe/serve/web/`` (no build step,
nothing fetched from elsewhere): it chats through ``/v1/chat/completions``, asks
``/v1/decide`` and draws the metrics feed. The feed sends one event when a client connects,
then one after news (a request begins or ends, a token), at most ten a second, always one
after a request ends; during a prefill or a decision, and while the grid cools down after
one, it also sends one on a timer (``bmoe.serve.live.next_tick``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from functools import cache
from importlib import resources

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bmoe.serve.live import MIN_INTERVAL_S, MetricsFeed, next_tick
from bmoe.serve.service import ServedSession

SNAPSHOT_TIMEOUT_S = 1.0  # the longest a feed waits for the decode in flight to end
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}


@cache
def asset(name: str) -> bytes:
    """A file of the page, read once from the package."""
    return resources.files("bmoe.serve").joinpath("web", name).read_bytes()


def _file(name: str) -> Response:
    return Response(asset(name), media_type=FILES[name], headers={"Cache-Control": "no-cache"})


async def metrics_events(served: ServedSession, feed: MetricsFeed) -> AsyncIterator[ServerSentEvent]:
    """One client's metrics events, until it goes away."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def notify() -> None:  # on the worker's thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            loop.call_soon_threadsafe(changed.set)

    unsubscribe = served.monitor.subscribe(notify)
    try:
        last = -math.inf
        while True:
            wait = last + MIN_INTERVAL_S - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            changed.clear()  # news from now on wakes the next event
            snap = None
            if served.streaming:
                snap = await asyncio.to_thread(served.expert_snapshot, SNAPSHOT_TIMEOUT_S)
            view = served.monitor.view()
            last = loop.time()
            governor = served.session.governor
            changes = None if governor is None else governor.changes
            body = feed.event(view, snap, last, changes, served.slots(), served.session.prompt_cache)
            yield ServerSentEvent(data=json.dumps(body, separators=(",", ":")))
            tick = next_tick(view, feed.cooling)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), tick)
    finally:
        unsubscribe()


def page_routes(served: ServedSession) -> list[Route]:
    """``GET /``, ``GET /web/{name}`` and ``GET /v1/bmoe/metrics``."""

    async def index(_: Request) -> Response:
        return _file("index.html")

    async def web_file(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in FILES:
            raise HTTPException(404, f"no file '{name}' here")
        return _file(name)

    async def metrics(_: Request) -> Response:
        feed = MetricsFeed(served.model_id, served.streaming)
        return EventSourceResponse(metrics_events(served, feed), sep="\n", ping=15)

    return [
        Route("/", index, methods=["GET"]),
        Route("/web/{name}", web_file, methods=["GET"]),
        Route("/v1/bmoe/metrics", metrics, methods=["GET"]),
    ]
