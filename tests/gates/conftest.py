"""Shared fixtures of the gate tests: the tiny generated models.

Models come from :func:`bmoe.testing.fixtures.fixture_path`, i.e. the user
cache (``fixtures/`` under bmoe's cache root, docs/files.md), so a rerun does
not rebuild them.
"""

from __future__ import annotations

import functools
import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.domain.streaming.victims_chooser import ScopeVerdict, ScopeWindow, VictimsChooser
from bmoe.runtime import victims_control
from bmoe.testing.fixtures import FIXTURES, fixture_path

TinyModelPath = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_model_path() -> TinyModelPath:
    """``tiny_model_path(name, seed=0)``: the (first shard) path of a cached fixture build."""

    @functools.cache
    def get(name: str, seed: int = 0) -> Path:
        return fixture_path(name, seed)

    return get


@pytest.fixture(scope="session", params=sorted(FIXTURES))
def fixture_name(request: pytest.FixtureRequest) -> str:
    """Each fixture name in turn (tests using it run once per tiny model)."""
    return str(request.param)


# Gate modules that set AMX_IN_ID = True say in each test's id how AMX was treated, on a
# machine where llama.cpp offers it (used, or off because its tiles fault here).
@pytest.fixture(autouse=True)
def amx_case() -> str:
    return ""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    from bmoe.testing.machine import AMX_OFFERED, SAFE_AMX_ID

    if AMX_OFFERED and getattr(metafunc.module, "AMX_IN_ID", False) and "amx_case" in metafunc.fixturenames:
        metafunc.parametrize("amx_case", [SAFE_AMX_ID], ids=[SAFE_AMX_ID])


# Loaded into the child by site: the first decode of more than one token dies of SIGSEGV
# inside llama.cpp's compute (the abort callback it polls between graph nodes).
_CRASH_SITE = textwrap.dedent(
    """
    import ctypes, os, signal
    import llama_cpp
    from bmoe.adapters.llama import context

    _decode = context.LlamaContext.decode

    def _die(_):
        os.kill(os.getpid(), signal.SIGSEGV)
        return False

    _CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p)(_die)

    def decode(self, tokens, start_pos, **kw):
        if len(tokens) > 1:
            llama_cpp.llama_set_abort_callback(self.ptr, _CALLBACK, None)
        return _decode(self, tokens, start_pos, **kw)

    context.LlamaContext.decode = decode
    """
)


@pytest.fixture()
def crashing_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(_CRASH_SITE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    return env





class HeldChooser(VictimsChooser):
    """``--cache-victims auto``'s chooser holding its first scope: what it would choose comes
    from this machine's timings (the wait for reads, the time a page move takes), so two
    executions compared decision for decision (the fast path against the reference policy,
    a run against its repeat) would differ by the machine's noise, not by a fault. The
    chooser's own decisions are tests/unit/test_victims_chooser.py's; a scope changed during
    a decode, bit for bit, is test_expert_rows_gates.py's (a scripted chooser)."""

    def observe(self, window: ScopeWindow) -> ScopeVerdict:
        self.last = ScopeVerdict(self.scope, None, None, False)
        return self.last


@pytest.fixture(autouse=True)
def victims_scope_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process gates run ``auto`` with its scope held (``HeldChooser``)."""
    monkeypatch.setattr(victims_control, "VictimsChooser", HeldChooser)
