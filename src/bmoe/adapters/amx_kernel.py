"""The AMX kernel probe: llama.cpp's own AMX kernel run in a child process, as it will run.

``run_kernel_probe(models, threads)`` starts ``python -m bmoe.adapters.amx_kernel``, which,
for each small quantized model it is given (Q4_0 and Q8_0 weights of shapes AMX takes):

1. computes a batch of ``PROBE_TOKENS`` tokens with llama.cpp's plain kernels (the model
   loaded without extra buffer types: the file's layout), logits for every row;
2. loads the model with llama.cpp's default buffer types and reports the bytes AMX holds;
3. computes the same batch with each thread count asked (1, an odd one, the session's),
   and reports its logits' relative error against step 1 and whether every row's argmax
   is the same.

Each step is one JSON line on stdout as it happens (``bmoe.domain.amx_kernel``), so a
child killed by a signal (a miscompiled kernel: SIGILL, SIGSEGV) still says where; the
parent lives on and ``kernel_verdict`` decides.

Faults can be injected on any machine (the gates' way to test what follows), with
``BMOE_AMX_PROBE_FAULT`` in the child's environment: ``SIGILL`` or ``SIGSEGV`` (the child
raises it where the AMX batch would compute), ``logits`` (the AMX logits perturbed by
their own size), ``hang`` (the child sleeps past the time limit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel, ModelParams
from bmoe.domain.amx_kernel import PROBE_TOKENS, KernelReport, event_line, read_report

FAULT_ENV = "BMOE_AMX_PROBE_FAULT"
FAULTS = ("SIGILL", "SIGSEGV", "logits", "hang")
TIMEOUT_S = 120.0


def run_kernel_probe(
    models: Sequence[tuple[str, Path]], threads: Sequence[int], timeout_s: float = TIMEOUT_S
) -> KernelReport:
    """Run the child on ``models`` (``(name, path)``) with each of ``threads``; its report."""
    command = [sys.executable, "-m", "bmoe.adapters.amx_kernel", ",".join(map(str, threads))]
    for name, path in models:
        command += [name, str(path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return read_report(out.splitlines(), timed_out=True)
    except OSError as exc:
        return KernelReport(status=-1, error=f"the probe could not start ({exc})")
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return read_report(done.stdout.splitlines(), signal=name)
    report = read_report(done.stdout.splitlines(), status=done.returncode)
    if done.returncode != 0 and not report.error:
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        return read_report(
            [*done.stdout.splitlines(), event_line("error", message=tail[0][-300:])], status=done.returncode
        )
    return report


# -- the child ----------------------------------------------------------------------------------


def _say(kind: str, **fields: object) -> None:
    print(event_line(kind, **fields), flush=True)


def _batch_logits(model: LlamaModel, threads: int) -> npt.NDArray[np.float32]:
    """The logits of every row of the probe's batch, computed with ``threads``."""
    params = ContextParams(
        n_ctx=2 * PROBE_TOKENS,
        n_batch=PROBE_TOKENS,
        n_ubatch=PROBE_TOKENS,
        n_threads=threads,
        flash_attn="off",
    )
    tokens = [(7 * i + 3) % model.n_vocab for i in range(PROBE_TOKENS)]
    with LlamaContext(model, params) as ctx:
        return np.array(ctx.decode_all_rows(tokens, 0), dtype=np.float32)


def _amx_logits(model: LlamaModel, threads: int, fault: str) -> npt.NDArray[np.float32]:
    """``_batch_logits`` with llama.cpp's default buffer types, the injected fault applied."""
    if fault in ("SIGILL", "SIGSEGV"):  # where the AMX batch would compute
        signal.raise_signal(getattr(signal, fault))
    if fault == "hang":
        time.sleep(10 * TIMEOUT_S)
    logits = _batch_logits(model, threads)
    if fault == "logits":  # off by the logits' own size
        noise = np.sin(np.arange(logits.size, dtype=np.float32)).reshape(logits.shape)
        logits = (logits + np.float32(np.abs(logits).max()) * noise).astype(np.float32)
    return logits


def _same_tokens(amx: npt.NDArray[np.float32], plain: npt.NDArray[np.float32]) -> bool:
    """Every row's argmax under AMX is the plain kernels' argmax, or a near-tie of it (its
    plain logit within 1% of the row's range below the best: two right kernels may pick
    either)."""
    rows = np.arange(plain.shape[0])
    best = plain.max(axis=-1)
    spread = best - plain.min(axis=-1)
    return bool(np.all(plain[rows, amx.argmax(axis=-1)] >= best - 0.01 * spread))


def _child(argv: list[str]) -> int:
    fault = os.environ.get(FAULT_ENV, "")
    threads = [int(t) for t in argv[0].split(",") if t]
    models = [(argv[i], Path(argv[i + 1])) for i in range(1, len(argv) - 1, 2)]
    try:
        for name, path in models:
            with LlamaModel(path, ModelParams(use_extra_bufts=False)) as model:
                plain = _batch_logits(model, 1)
            with LlamaModel(path, ModelParams(use_extra_bufts=True)) as model:
                _say("placed", model=name, amx_bytes=model.weight_buffers.get("AMX", 0))
                for n in threads:
                    _say("computing", model=name, threads=n)
                    amx = _amx_logits(model, n, fault)
                    error = float(np.linalg.norm(amx - plain) / max(float(np.linalg.norm(plain)), 1e-30))
                    same = _same_tokens(amx, plain)
                    _say("run", model=name, threads=n, relative_error=error, same_tokens=same)
    except Exception as exc:  # a failure that is not a fault: said, then a plain exit status
        _say("error", message=f"{type(exc).__name__}: {exc}"[:300])
        return 1
    return 0


if __name__ == "__main__":
    # a fault must kill the child plainly, with no core file written for it
    import resource

    from bmoe.adapters.llama.log import ensure_backend

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ensure_backend()
    raise SystemExit(_child(sys.argv[1:]))
