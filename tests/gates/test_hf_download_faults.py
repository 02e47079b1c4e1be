"""``-hf`` downloads on a disk that fails or a connection that is cut (a local stand-in for
the Hub, ``tests/hf_range_server.py``): nothing is ever left under the model's name, the
next run starts again or resumes and gets the whole file, and running out of space says
how much room the model needs."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from disk_faults import fault_env, small_tmpfs
from hf_range_server import HubStandIn, serving

pytest.importorskip("huggingface_hub")

REPO, NAME = "someone/tiny-GGUF", "tiny-Q4_K_M.gguf"
DATA = os.urandom(300_000)
FETCH = (
    "from bmoe.adapters.hf_hub import fetch_model; import sys; print(fetch_model(sys.argv[1], sys.argv[2]))"
)


def fetch(
    hub: HubStandIn, cache: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A child (huggingface_hub reads its settings when imported) fetching the model."""
    env = dict(env or os.environ)
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_PROGRESS_BARS="1")
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run(
        [sys.executable, "-c", FETCH, REPO, NAME], env=env, capture_output=True, text=True, timeout=300
    )


def under_its_name(cache: Path) -> list[Path]:
    """Files standing under the model's name, or as a finished blob."""
    named = list(cache.rglob(f"snapshots/*/{NAME}"))
    blobs = [p for p in cache.rglob("blobs/*") if not p.name.endswith(".incomplete")]
    return named + blobs


def test_a_download_out_of_space_says_the_room_needed_and_keeps_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    cache.mkdir()
    with serving(HubStandIn({REPO: {NAME: DATA}})) as hub:
        failed = fetch(hub, cache, fault_env(cache, "write", errno.ENOSPC))
        assert failed.returncode != 0
        assert "out of space" in failed.stderr and "the model needs 0.3 MiB" in failed.stderr, failed.stderr[
            -2000:
        ]
        assert under_its_name(cache) == []
        again = fetch(hub, cache)  # space back: the next run gets the whole file
        assert again.returncode == 0, again.stderr[-2000:]
        assert Path(again.stdout.strip()).read_bytes() == DATA


def test_a_disk_too_small_is_said_before_anything_downloads(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "hf", "64k") as cache, serving(HubStandIn({REPO: {NAME: DATA}})) as hub:
        failed = fetch(hub, cache)
        assert failed.returncode != 0
        assert f"the model needs 0.3 MiB in {cache}" in failed.stderr, failed.stderr[-2000:]
        assert hub.served.get(f"{REPO}/{NAME}", 0) == 0  # nothing downloaded
        assert under_its_name(cache) == []


def test_a_cut_download_keeps_nothing_and_the_next_run_gets_the_whole_file(tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    with serving(HubStandIn({REPO: {NAME: DATA}}, mode="cut")) as hub:
        failed = fetch(hub, cache)
        assert failed.returncode != 0 and "cannot get" in failed.stderr, failed.stderr[-2000:]
        assert under_its_name(cache) == []
        hub.mode = ""
        again = fetch(hub, cache)
        assert again.returncode == 0, again.stderr[-2000:]
        assert Path(again.stdout.strip()).read_bytes() == DATA
