"""Never crash on the user's machine: the AMX probe runs the tile instructions where a fault
cannot kill the caller, a refused AMX places the weights where stock llama.cpp's other
buffer types would, and a process that dies of a signal says so in one line.

On this project's machines (no AMX in llama.cpp's build) the fault is real: a CPU without
AMX gets SIGILL from the tile instructions, which the probe's child takes and its parent
survives. ``--amx off`` exercises bmoe's own placement on every machine: where llama.cpp
offers no AMX, it must be stock's placement exactly, bit for bit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import numpy as np
import pytest

from bmoe.adapters import cpu_features
from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel, ModelParams
from bmoe.adapters.llama.repack import buffer_type_name
from bmoe.cext import cpu_probe, crash_signal, expert_stream
from bmoe.client import SessionClient, SessionCrashedError
from bmoe.domain.cpu_features import AmxVerdict
from bmoe.domain.crash import CRASH_PREFIX
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.runtime import Session, SessionConfig, cpu_choice
from bmoe.testing.machine import AMX_OFFERED, STOCK_IN_PROCESS
from bmoe.testing.oracle import stock_greedy
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

AMX_IN_ID = True  # on an AMX machine each id says whether AMX was used or turned off
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2, flash_attn="off")
SHAPE = SyntheticShape(n_layer=3, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2, head_dim=64)
REQUEST = GenerateRequest("The quick brown fox jumps over the lazy dog", n_predict=10)
CPU_ADVERTISES_AMX = bool(cpu_probe.amx_cpuid() & cpu_probe.CPUID_AMX_TILE)


@pytest.fixture(scope="module")
def q4_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("machine")
    return write_synthetic(root / "q4_0.gguf", attrs.evolve(SHAPE, quant="q4_0"), seed=3, progress=False)


def session(path: Path, amx: str, stream: StreamConfig | None = None) -> Session:
    return Session.open(
        SessionConfig(model_path=path, context=PARAMS, amx=amx, stream=stream or StreamConfig())  # type: ignore[arg-type]
    )


def weight_buffers(model: LlamaModel) -> dict[str, str]:
    """The buffer type of every weight the graph reads, as the model holds them."""
    streamer = expert_stream.ExpertStreamer(n_layer=64, n_expert=1, n_proj=1)
    with LlamaContext(model, PARAMS, eval_callback=streamer) as ctx:
        streamer.mode = expert_stream.MODE_CAPTURE
        ctx.decode([0], 0)
    return {name: buffer_type_name(t) for name, (t, _) in streamer.captured_weights().items()}


# -- the probe ---------------------------------------------------------------------------------


@pytest.mark.skipif(not cpu_probe.SUPPORTED, reason="the AMX probe runs on x86-64 Linux only")
@pytest.mark.skipif(CPU_ADVERTISES_AMX, reason="this CPU lists AMX: its tiles may well run")
def test_the_probe_runs_the_tiles_in_a_child_whose_fault_the_caller_survives() -> None:
    """On a CPU without AMX the tile instructions really fault: the child dies of SIGILL and
    the verdict names it."""
    verdict = cpu_features.run_probe(ask_permission=False)
    assert not verdict.usable
    assert "fault on this CPU (SIGILL in the probe)" in verdict.why, verdict.why
    assert "CPUID lists no AMX" in verdict.why


def test_the_verdict_is_cached_per_machine_and_llama_cpp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BMOE_CACHE_DIR", str(tmp_path))
    first = cpu_features.probe_amx()
    assert (tmp_path / "cpu-probe.json").is_file()

    def no_second_probe(*_: object, **__: object) -> None:
        raise AssertionError("probed again despite the cache")

    monkeypatch.setattr(cpu_features, "run_probe", no_second_probe)
    assert cpu_features.probe_amx() == first
    if not CPU_ADVERTISES_AMX:
        assert not first.usable


# -- placement -----------------------------------------------------------------------------------


@pytest.mark.skipif(AMX_OFFERED, reason="llama.cpp offers AMX here: --amx on changes the placement")
def test_amx_on_where_llama_cpp_offers_no_amx_changes_nothing(q4_0: Path) -> None:
    with session(q4_0, "auto") as s:
        auto = s.generate(REQUEST).tokens, s.last_logits(), s.weight_layout
    with session(q4_0, "on") as s:
        assert not s.amx.offered and s.amx.note == ""
        on = s.generate(REQUEST).tokens, s.last_logits(), s.weight_layout
    assert auto[0] == on[0] and np.array_equal(auto[1], on[1]) and auto[2] == on[2]


def test_amx_off_puts_no_weight_in_amx_and_places_as_stock_llama_cpp(q4_0: Path) -> None:
    """Resident with AMX refused: bmoe loads without extra buffer types and places each weight
    itself. No weight is in AMX; where llama.cpp offers no AMX, every weight is in the buffer
    type stock llama.cpp's load puts it in, and tokens and logits equal bmoe's default run."""
    with session(q4_0, "off") as s:
        ours = weight_buffers(s.model)
        layout = s.weight_layout
        tokens, logits = s.generate(REQUEST).tokens, s.last_logits()
    assert "AMX" not in set(ours.values())
    assert layout.resident and layout.repacked, layout
    assert "weights repacked by bmoe at load" in layout.summary()
    if AMX_OFFERED:
        assert "AMX off (--amx off)" in layout.summary()
        return
    with LlamaModel(q4_0, ModelParams(use_extra_bufts=True)) as stock:  # llama.cpp's own placement
        assert ours == weight_buffers(stock)
    with session(q4_0, "auto") as s:
        assert s.weight_layout.by_llama
        assert s.generate(REQUEST).tokens == tokens
        assert np.array_equal(s.last_logits(), logits)


@pytest.mark.skipif(AMX_OFFERED, reason="llama.cpp offers AMX here: the real probe decides")
def test_a_probe_that_says_the_tiles_fault_refuses_amx_with_one_line_and_places_as_stock(
    q4_0: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--amx auto`` where llama.cpp offers AMX (said so here) and the probe answers that its
    tiles fault: the weights are placed by bmoe, none in AMX, as stock's CPU_REPACK placement,
    and the reason is on the ``mode:`` line's words (``BMOE_READY``'s ``weights`` too)."""
    with session(q4_0, "auto") as s:
        want = s.generate(REQUEST).tokens, s.last_logits()
    faults = AmxVerdict(usable=False, why="the tile instructions fault on this CPU (SIGSEGV in the probe)")
    monkeypatch.setattr(cpu_choice, "offered_buffer_types", lambda: ("AMX", "CPU_REPACK"))
    monkeypatch.setattr(cpu_choice, "amx_verdict", lambda threads: faults)
    with session(q4_0, "auto") as s:
        assert s.amx.refused == ("AMX",)
        summary = s.weight_layout.summary()
        assert summary.startswith("weights repacked by bmoe at load (")
        assert summary.endswith(f"; AMX refused: {faults.why} (--amx on uses it anyway)")
        assert "AMX" not in set(weight_buffers(s.model).values())
        assert s.generate(REQUEST).tokens == want[0]
        assert np.array_equal(s.last_logits(), want[1])
    with session(q4_0, "auto", StreamConfig(enabled=True, cache_mb=1)) as s:
        assert s.streaming is not None and s.weight_layout.summary().endswith("(--amx on uses it anyway)")
        assert s.generate(REQUEST).tokens == want[0]
        assert np.array_equal(s.last_logits(), want[1])


@pytest.mark.parametrize("cache_mb", [0, 1024])
def test_streamed_with_amx_off_equals_resident_with_amx_off(q4_0: Path, cache_mb: int) -> None:
    with session(q4_0, "off") as s:
        tokens, logits = s.generate(REQUEST).tokens, s.last_logits()
    with session(q4_0, "off", StreamConfig(enabled=True, cache_mb=cache_mb)) as s:
        assert s.streaming is not None
        assert "AMX" not in {name for name, _ in s.weight_layout.buffers}
        assert s.generate(REQUEST).tokens == tokens
        assert np.array_equal(s.last_logits(), logits)


@pytest.mark.skipif(
    not STOCK_IN_PROCESS, reason="llama.cpp's AMX faults here: stock llama.cpp never runs in the test process"
)
def test_the_stock_oracle_in_a_child_gives_what_it_gives_in_process(
    q4_0: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child oracle (used where stock llama.cpp may crash) is the same oracle."""
    monkeypatch.delenv("BMOE_STOCK_IN_CHILD", raising=False)
    here = stock_greedy(q4_0, REQUEST.prompt, 6)
    monkeypatch.setenv("BMOE_STOCK_IN_CHILD", "1")
    there = stock_greedy(q4_0, REQUEST.prompt, 6)
    assert here[0] == there[0] and np.array_equal(here[1], there[1])


# -- the crash line --------------------------------------------------------------------------------

def _the_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith(CRASH_PREFIX)]
    assert len(lines) == 1, stderr
    return lines[0]


def test_the_handler_and_the_words_agree_on_the_prefix() -> None:
    assert crash_signal.PREFIX == CRASH_PREFIX


def test_a_library_user_whose_compute_dies_of_sigsegv_gets_one_line_naming_it(
    q4_0: Path, crashing_env: dict[str, str]
) -> None:
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from bmoe.runtime import Session, SessionConfig, cpu_choice
        from bmoe.domain.generation import GenerateRequest
        with Session.open(SessionConfig(model_path=Path({str(q4_0)!r}))) as s:
            s.generate(GenerateRequest("The quick brown fox", n_predict=4))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=crashing_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == -11, done.stderr
    line = _the_line(done.stderr)
    assert line.startswith(f"{CRASH_PREFIX}SIGSEGV while running {q4_0.name} (weights in "), line
    assert "CPU_REPACK" in line and "--no-repack" in line, line


def test_the_command_line_names_the_crash(q4_0: Path, crashing_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bmoe.cli", "-m", str(q4_0), "-p", "The quick brown fox", "-n", "4"],
        env=crashing_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -11, done.stderr
    assert f"SIGSEGV while running {q4_0.name}" in _the_line(done.stderr)


def test_the_session_client_raises_a_typed_error_with_the_line(
    q4_0: Path, crashing_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", crashing_env["PYTHONPATH"])
    with (
        SessionClient(["-m", str(q4_0)], timeout=120) as client,
        pytest.raises(SessionCrashedError) as caught,
    ):
        client.generate("The quick brown fox", n_predict=4)
    message = str(caught.value)
    assert message.startswith(f"{CRASH_PREFIX}SIGSEGV while running {q4_0.name}"), message
    assert "exit status -11" in message


