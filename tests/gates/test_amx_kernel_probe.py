"""The AMX kernel probe, with faults injected, on every machine (docs/machines.md).

llama.cpp's AMX kernel as gcc 12 builds it loads an unconfigured tile config and dies of
SIGILL or SIGSEGV at the first batched matmul, on CPUs whose tiles run fine. The probe's
kernel step runs that kernel in a child. Here the child is made to die (``SIGILL``,
``SIGSEGV``), to compute wrong logits, or to hang (``BMOE_AMX_PROBE_FAULT``), and
``BMOE_AMX_PRETEND_OFFERED=1`` makes AMX count as offered where this llama.cpp has none: the
session that follows refuses AMX, names why on its ``mode:`` line, and computes what
``--amx off`` computes, resident and streamed, bit for bit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from bmoe.adapters import amx_kernel, cpu_features
from bmoe.adapters.llama.repack import offered_buffer_types
from bmoe.domain.amx_kernel import kernel_verdict
from bmoe.domain.cpu_features import AmxVerdict
from bmoe.testing.machine import AMX_BROKEN
from bmoe.tinymodel.probe_models import probe_models
from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

TILES = AmxVerdict(True, "the tiles ran (assumed here)")
SHAPE = SyntheticShape(n_layer=3, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2, head_dim=64)
PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def models() -> list[tuple[str, Path]]:
    return probe_models()


@pytest.fixture(scope="module")
def q4_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("amx-kernel")
    return write_synthetic(root / "q4_0.gguf", attrs.evolve(SHAPE, quant="q4_0"), seed=3, progress=False)


def probe_with(fault: str, models: list[tuple[str, Path]], monkeypatch: pytest.MonkeyPatch, **kw: float):
    monkeypatch.setenv(amx_kernel.FAULT_ENV, fault)
    return amx_kernel.run_kernel_probe(models, (1, 3), **kw)


@pytest.mark.parametrize("fault", ["SIGILL", "SIGSEGV"])
def test_a_kernel_that_faults_kills_only_the_child_and_the_verdict_names_the_signal(
    fault: str, models: list[tuple[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    report = probe_with(fault, models, monkeypatch)
    if AMX_BROKEN and report.signal != fault:  # this llama.cpp's AMX kernel faulted first, for real
        assert report.signal in ("SIGILL", "SIGSEGV"), report
    else:
        assert report.signal == fault, report
    assert report.at == "Q4_0, 1 thread"
    verdict = kernel_verdict(report, TILES)
    assert not verdict.usable
    assert verdict.why.startswith(
        f"llama.cpp's AMX kernel faulted in the probe ({report.signal} with Q4_0, 1 thread"
    )


def test_wrong_logits_are_refused(models: list[tuple[str, Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    report = probe_with("logits", models, monkeypatch)
    verdict = kernel_verdict(report, TILES)
    assert not verdict.usable
    if not report.signal:  # (where the real kernel faults, it dies before its logits are compared)
        assert "computed wrong logits (Q4_0, 1 threads: relative error" in verdict.why, verdict.why


def test_a_kernel_that_hangs_is_refused_after_the_time_limit(
    models: list[tuple[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    report = probe_with("hang", models, monkeypatch, timeout_s=20.0)
    assert report.timed_out or (AMX_BROKEN and report.signal), report
    assert not kernel_verdict(report, TILES).usable


def test_without_a_fault_the_probe_compares_the_kernels_and_right_kernels_agree(
    models: list[tuple[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fault injected: where AMX runs right every batch agrees within the tolerance;
    where llama.cpp offers no AMX the batches still ran (the other extra buffer types against
    the plain kernels, which agree too) and the verdict says AMX was untested."""
    monkeypatch.delenv(amx_kernel.FAULT_ENV, raising=False)
    report = amx_kernel.run_kernel_probe(models, (1, 3))
    verdict = kernel_verdict(report, TILES)
    if report.signal:
        assert AMX_BROKEN and not verdict.usable
        return
    assert [(r.model, r.threads) for r in report.runs] == [("Q4_0", 1), ("Q4_0", 3), ("Q8_0", 1), ("Q8_0", 3)]
    assert all(r.right for r in report.runs), report.runs
    if "AMX" in offered_buffer_types():  # really offered (BMOE_AMX_PRETEND_OFFERED aside)
        assert all(n > 0 for _, n in report.amx_bytes), report
        assert verdict.usable
    else:
        assert "placed no weight" in verdict.why


def test_the_verdict_is_probed_again_for_another_llama_cpp_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reinstalling llama-cpp-python (another compiler, other flags) changes its library
    files: the cached verdict does not carry over."""
    monkeypatch.setenv("BMOE_CACHE_DIR", str(tmp_path))
    probes: list[int] = []

    def tiles() -> AmxVerdict:
        probes.append(1)
        return AmxVerdict(False, "test")

    monkeypatch.setattr(cpu_features, "run_probe", tiles)
    cpu_features.probe_amx()
    cpu_features.probe_amx()
    assert len(probes) == 1
    library = cpu_features.llama_library()
    assert "libggml-cpu" in library, library
    monkeypatch.setattr(cpu_features, "llama_library", lambda: library + " rebuilt")
    cpu_features.probe_amx()
    assert len(probes) == 2


def test_a_yes_for_fewer_threads_is_probed_again_with_the_sessions_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BMOE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_features, "run_probe", lambda: TILES)
    asked: list[tuple[int, ...]] = []

    def kernel(threads: tuple[int, ...]) -> amx_kernel.KernelReport:
        asked.append(threads)
        lines = [amx_kernel.event_line("placed", model="Q4_0", amx_bytes=1)]
        lines += [
            amx_kernel.event_line("run", model="Q4_0", threads=n, relative_error=0.0, same_tokens=True)
            for n in threads
        ]
        return amx_kernel.read_report(lines)

    assert cpu_features.probe_amx(kernel=kernel, threads=(1, 3, 2)).usable
    assert cpu_features.probe_amx(kernel=kernel, threads=(1, 3, 2)).usable
    assert cpu_features.probe_amx(kernel=kernel, threads=(1, 3, 8)).usable
    assert asked == [(1, 2, 3), (1, 2, 3, 8)]


# -- what a session does with the verdict: the whole command, in a child, faults injected --


def cli(path: Path, tmp_path: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"BMOE_CACHE_DIR": str(tmp_path / "cache"), "BMOE_BUSY_WARNING": "0", "PATH": "/usr/bin:/bin"}
    if fault is not None:
        env |= {"BMOE_AMX_PRETEND_OFFERED": "1", amx_kernel.FAULT_ENV: fault}
    command = [sys.executable, "-m", "bmoe.cli", "-m", str(path), "-p", PROMPT, "-n", "8", "-t", "2", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)


def mode_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("mode: "))


@pytest.mark.parametrize("fault", ["SIGILL", "SIGSEGV"])
@pytest.mark.parametrize("stream", [False, True], ids=["resident", "streamed"])
def test_a_faulting_kernel_is_refused_and_the_defaults_compute_what_amx_off_computes(
    fault: str, stream: bool, q4_0: Path, tmp_path: Path
) -> None:
    more = ("--moe-stream", "--cache-mb", "1") if stream else ()
    faulted = cli(q4_0, tmp_path, *more, fault=fault)
    assert faulted.returncode == 0, faulted.stderr
    line = mode_line(faulted.stderr)
    assert "AMX refused: llama.cpp's AMX kernel faulted in the probe (" in line, line
    if not AMX_BROKEN:  # (where the real kernel faults, that fault may come first)
        assert f"({fault} with Q4_0, 1 thread;" in line, line
    off = cli(q4_0, tmp_path, *more, "--amx", "off")
    resident_off = cli(q4_0, tmp_path, "--amx", "off")
    assert off.returncode == 0 and resident_off.returncode == 0, off.stderr + resident_off.stderr
    assert faulted.stdout == off.stdout == resident_off.stdout
    assert "repacked" in line, line


def test_a_plain_run_with_pretence_and_no_fault_refuses_an_untested_amx(q4_0: Path, tmp_path: Path) -> None:
    """Where llama.cpp offers no AMX but the tests pretend it does, the kernel step finds no
    weight in AMX and refuses: the whole suite can run so on any machine."""
    done = cli(q4_0, tmp_path, fault="")
    assert done.returncode == 0, done.stderr
    line = mode_line(done.stderr)
    if "AMX" in offered_buffer_types():  # really offered: the real kernel decides
        assert "AMX refused" in line or "AMX" not in line
    else:
        assert "AMX refused: llama.cpp placed no weight of the probe's model in AMX" in line, line
