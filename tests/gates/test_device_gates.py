"""The dense part on another device, experts streamed on the host: a llama.cpp RPC server on
loopback (``python -m bmoe.rpc_server``, started here) serves this machine's CPU as a device.

Under the same placement, streamed == resident bit for bit (tokens and logits; decisions'
log-probabilities) on every MoE fixture family, with the experts of every layer on the host
(streamed), and with the experts of the offloaded layers resident on the device
(``--n-cpu-moe``: only the host's are streamed). The routing ids of a layer computed on the
device are read back through ggml's backend API (``device_topk`` counts them). A server
that dies mid-request ends the session process with llama.cpp's own message; no output
follows.

Skipped, saying which CMake flag is missing, where llama-cpp-python was built without RPC.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.adapters.llama.devices import rpc_available
from bmoe.client import SessionClient, SessionClientError
from bmoe.domain.decide import DecideConfig, DecideRequest
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.placement import Placement
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ConfigError
from bmoe.runtime import Session, SessionConfig
from bmoe.testing.fixtures import ARCH_FIXTURES

pytestmark = pytest.mark.skipif(
    not rpc_available(),
    reason='llama-cpp-python was built without its RPC backend (CMAKE_ARGS="-DGGML_RPC=ON")',
)

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
REQUEST = GenerateRequest("The quick brown fox jumps over the lazy dog", n_predict=10)
FAMILIES = sorted(set(ARCH_FIXTURES.values()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bmoe.rpc_server", "--port", str(port), "-t", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the RPC server did not start")


@pytest.fixture(scope="module")
def rpc_endpoint() -> Iterator[str]:
    proc, endpoint = _start_server()
    try:
        yield endpoint
    finally:
        proc.kill()
        proc.wait()


def run(path: Path, placement: Placement, *, stream: bool) -> tuple[tuple[int, ...], np.ndarray, int]:
    config = SessionConfig(
        model_path=path,
        context=PARAMS,
        placement=placement,
        stream=StreamConfig(enabled=stream, cache_mb=None),
    )
    with Session.open(config) as s:
        if stream:
            assert s.streaming is not None, s.notes
            s.streaming.set_budget(3 * s.model.n_expert_used * s.streaming.info.entry_bytes)
        result = s.generate(REQUEST)
        device_topk = s.streaming.streaming.streamer.stats()["device_topk"] if s.streaming else 0
        return result.tokens, s.last_logits(), device_topk


@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_equals_resident_with_the_dense_part_on_an_rpc_device(
    family: str, tiny_model_path: TinyModel, rpc_endpoint: str
) -> None:
    path = tiny_model_path(family)
    half = Placement(n_gpu_layers=2, rpc=(rpc_endpoint,), cpu_moe=True)
    tokens, logits, _ = run(path, half, stream=False)
    streamed = Placement(n_gpu_layers=2, rpc=(rpc_endpoint,))  # experts on the host: streamed
    s_tokens, s_logits, device_topk = run(path, streamed, stream=True)
    assert s_tokens == tokens
    assert np.array_equal(s_logits, logits)
    assert device_topk > 0  # a layer's routing was read back from the device


@pytest.mark.parametrize("family", ["qwen3moe", "mixtral"])
def test_experts_resident_on_the_device_are_not_streamed(
    family: str, tiny_model_path: TinyModel, rpc_endpoint: str
) -> None:
    """``--n-cpu-moe 1``: layer 0's experts stay on the host (streamed); the offloaded layers'
    experts are resident on the device, served there."""
    path = tiny_model_path(family)
    placement = Placement(n_gpu_layers=99, rpc=(rpc_endpoint,), n_cpu_moe=1)
    tokens, logits, _ = run(path, placement, stream=False)
    stream = StreamConfig(enabled=True)
    config = SessionConfig(model_path=path, context=PARAMS, placement=placement, stream=stream)
    with Session.open(config) as s:
        assert s.streaming is not None, s.notes
        streamer = s.streaming.streaming.streamer
        streamed_layers = {layer for layer in range(streamer.n_layer) if streamer.entry_bytes(layer)}
        assert streamed_layers == {0}
        stops, requests = streamer.stats()["topk_stops"], s.streaming.counters().requests
        result = s.generate(REQUEST)
        assert result.tokens == tokens
        assert np.array_equal(s.last_logits(), logits)
        # the graph stops at layer 0's topk only: a device's layers go on without a stop
        stops, requests = streamer.stats()["topk_stops"] - stops, s.streaming.counters().requests - requests
        assert stops == requests > 0


@pytest.mark.parametrize("family", ["qwen3moe", "mixtral"])
def test_decisions_streamed_equal_resident_with_the_dense_part_on_an_rpc_device(
    family: str, tiny_model_path: TinyModel, rpc_endpoint: str
) -> None:
    """The decide path reads llama.cpp's logits (host memory whatever the placement)."""
    path = tiny_model_path(family)
    request = DecideRequest(
        prefix="Task: turn on Wi-Fi. ", suffix="A) Network B) Display?", choices=("A", "B")
    )
    results = []
    for stream, placement in (
        (False, Placement(n_gpu_layers=2, rpc=(rpc_endpoint,), cpu_moe=True)),
        (True, Placement(n_gpu_layers=2, rpc=(rpc_endpoint,))),
    ):
        config = SessionConfig(
            model_path=path,
            context=PARAMS,
            placement=placement,
            decide=DecideConfig(enabled=True, prefix_cache="on"),  # the same pieces both ways
            stream=StreamConfig(enabled=stream, cache_mb=None),
        )
        with Session.open(config) as s:
            results.append([s.decide(request).choice_logp for _ in range(2)])  # the second reuses the prefix
    assert results[0] == results[1]


def test_the_decide_probe_with_layers_on_a_device_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="decide-probe"):
        SessionConfig(
            model_path=Path("x.gguf"),
            placement=Placement(n_gpu_layers=1, rpc=("127.0.0.1:1",)),
            decide=DecideConfig(enabled=True, probe=Path("probe.jsonl")),
        )


def test_an_rpc_server_that_dies_mid_request_ends_the_session_without_output(
    tiny_model_path: TinyModel,
) -> None:
    """llama.cpp's RPC client aborts its process when the server is gone: the session process
    ends with llama.cpp's message, the client raises, and no token of the request arrives."""
    proc, endpoint = _start_server()
    path = tiny_model_path("qwen3moe")
    try:
        args = ["-m", str(path), "--moe-stream", "-ngl", "2", "--rpc", endpoint, "-c", "256"]
        with SessionClient(args, timeout=60) as client:
            client.generate("Hello", n_predict=4)
            proc.kill()
            proc.wait()
            with pytest.raises(SessionClientError):
                client.generate("And then?", n_predict=64)
            assert client.process.wait(timeout=30) != 0
            assert any("RPC" in line for line in client.stderr_tail), client.stderr_tail
    finally:
        if proc.poll() is None:
            proc.kill()


def test_an_expert_store_serves_the_host_s_layers_beside_a_device(
    tiny_model_path: TinyModel, rpc_endpoint: str
) -> None:
    """The store holds every layer's experts; with the offloaded layers' experts resident on
    the device it serves the host's (layer 0) and checks out against the model all the same."""
    from bmoe.store.__main__ import main as store_command

    path = tiny_model_path("mixtral")
    assert store_command(["-m", str(path)]) == 0
    placement = Placement(n_gpu_layers=99, rpc=(rpc_endpoint,), n_cpu_moe=1)
    tokens, logits, _ = run(path, placement, stream=False)
    config = SessionConfig(
        model_path=path, context=PARAMS, placement=placement, stream=StreamConfig(enabled=True)
    )
    with Session.open(config) as s:
        assert s.streaming is not None and s.streaming.info.store.path is not None, s.notes
        result = s.generate(REQUEST)
        got_logits = s.last_logits()
        assert s.streaming.counters().bytes_in_place > 0
    assert result.tokens == tokens
    assert np.array_equal(got_logits, logits)
