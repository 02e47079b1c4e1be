"""Wiring: where concrete adapters meet the use cases (a composition root, as in
cosmicpython's ``bootstrap``).

- ``Session`` / ``SessionConfig`` (``session_config``): load once, generate many times
  (spec/session.md);
- ``run(config, request)``: the one-shot path, a thin wrapper over a session.
"""

from __future__ import annotations

from bmoe.domain.generation import GenerateRequest, RunResult
from bmoe.runtime.session import Session
from bmoe.runtime.session_config import SessionConfig
from bmoe.service.session_engine import OnProgress


def run(config: SessionConfig, request: GenerateRequest, on_progress: OnProgress | None = None) -> RunResult:
    """Open a session, generate once, close it (also on error)."""
    with Session.open(config) as session:
        return session.generate(request, on_progress)


__all__ = ["Session", "SessionConfig", "run"]
