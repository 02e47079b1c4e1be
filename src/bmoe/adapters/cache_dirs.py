"""Where bmoe keeps the files it can rebuild: one root, one place per kind (docs/files.md).

The root is ``$BMOE_CACHE_DIR``, else ``$XDG_CACHE_HOME/bmoe`` (an absolute path, as the
XDG spec asks: a relative one is ignored), else ``~/.cache/bmoe``. Under it:

- ``profiles/``: the usage profiles of ``--profile auto`` (``$BMOE_PROFILE_DIR`` moves them);
- ``cpu-probe.json``: the AMX probe's verdict;
- ``fixtures/``: the generated tiny models, the built-in default among them
  (``$BMOE_FIXTURE_DIR`` moves them);
- ``bench/``: the generated bench models (``$BMOE_BENCH_DIR`` moves them).

An empty variable counts as unset. Each function reads the environment when called, so a
variable set later (a test, a child process's environment) is honoured.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_ROOT = "BMOE_CACHE_DIR"
ENV_PROFILE_DIR = "BMOE_PROFILE_DIR"
ENV_FIXTURE_DIR = "BMOE_FIXTURE_DIR"
ENV_BENCH_DIR = "BMOE_BENCH_DIR"
ENV_STORE_DIR = "BMOE_STORE_DIR"
PROBE_VERDICT_FILE = "cpu-probe.json"


def cache_root() -> Path:
    """``$BMOE_CACHE_DIR``, else ``$XDG_CACHE_HOME/bmoe`` (when absolute), else ``~/.cache/bmoe``."""
    if root := os.environ.get(ENV_ROOT):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "bmoe"
    return Path.home() / ".cache" / "bmoe"


def _kind_dir(override: str, name: str) -> Path:
    """``$override`` if set, else the folder ``name`` under the root."""
    configured = os.environ.get(override)
    return Path(configured) if configured else cache_root() / name


def profile_dir() -> Path:
    """The folder of ``--profile auto``'s files: ``$BMOE_PROFILE_DIR``, else ``<root>/profiles``."""
    return _kind_dir(ENV_PROFILE_DIR, "profiles")


def probe_verdict_file() -> Path:
    """The AMX probe's cached verdict: ``<root>/cpu-probe.json``."""
    return cache_root() / PROBE_VERDICT_FILE


def fixture_dir() -> Path:
    """The generated tiny models: ``$BMOE_FIXTURE_DIR``, else ``<root>/fixtures``."""
    return _kind_dir(ENV_FIXTURE_DIR, "fixtures")


def bench_dir() -> Path:
    """The generated bench models: ``$BMOE_BENCH_DIR``, else ``<root>/bench``."""
    return _kind_dir(ENV_BENCH_DIR, "bench")


def store_dir() -> Path:
    """Where ``python -m bmoe.store`` writes: ``$BMOE_STORE_DIR``, else ``<root>/expert-stores``."""
    return _kind_dir(ENV_STORE_DIR, "expert-stores")
