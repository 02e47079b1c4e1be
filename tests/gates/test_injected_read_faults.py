"""An I/O error injected on the model file's expert reads (``tests/disk_faults.c``: ``pread``
failing with ``EIO`` once a flag file exists, after the session opened): the session ends
with one fatal ``ExpertReadError`` whose message names the file, the offset and the tensor,
and every later request raises the same (docs/reliability.md). An ``EIO`` on a prompt state's
read is a cache miss instead (``test_writer_faults.py``)."""

from __future__ import annotations

import errno
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from disk_faults import fault_env

TinyModel = Callable[[str], Path]

CHILD = r"""
import json, sys
from pathlib import Path
from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ExpertReadError, is_fatal
from bmoe.runtime import Session, SessionConfig

model, flag, policy, store = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
cfg = SessionConfig(
    model_path=model,
    context=ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2),
    stream=StreamConfig(enabled=True, cache_mb=0, policy=policy, expert_store=store),
)
out = {}
with Session.open(cfg) as s:
    s.generate(GenerateRequest("The quick brown fox", n_predict=2))
    s.streaming.evict_all()
    flag.write_text("on")  # from now on every read of the model file fails with EIO
    errors = []
    for _ in range(2):
        try:
            s.generate(GenerateRequest("The quick brown fox", n_predict=2))
            errors.append(None)
        except Exception as exc:
            errors.append([type(exc).__name__, str(exc), is_fatal(exc)])
    out["errors"] = errors
    out["store"] = str(s.streaming.info.store.path)
print(json.dumps(out))
"""


def _child(model: Path, folder: Path, tmp_path: Path, policy: str, store: str = "off") -> dict:
    flag = tmp_path / "eio-now"
    env = fault_env(folder, "read", errno.EIO, while_file=flag)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(flag), policy, store],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("policy", ["fast", "reference"])
def test_an_eio_reading_the_model_names_file_offset_and_tensor_and_is_fatal(
    tiny_model_path: TinyModel, tmp_path: Path, policy: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    model = folder / "model.gguf"
    shutil.copy(tiny_model_path("qwen3moe"), model)
    first, again = _child(model, folder, tmp_path, policy)["errors"]
    assert first is not None and first[0] == "ExpertReadError" and first[2] is True, first
    pattern = (
        rf"expert read failed: {re.escape(str(model))} at offset \d+ \(blk\.\d+\.ffn_\w+_exps\.weight\): "
    )
    assert re.match(pattern + "Input/output error", first[1]), first[1]
    assert again is not None and again[1] == first[1]  # sticky


@pytest.mark.parametrize("policy", ["fast", "reference"])
def test_an_eio_reading_the_expert_store_names_the_store_and_the_tensor(tmp_path: Path, policy: str) -> None:
    """The model on a good disk, its expert store (``python -m bmoe.store --out``) on one
    that fails: the error names the store, an offset in it and the tensor there."""
    from bmoe.store.__main__ import main as store_command
    from bmoe.tinymodel.synthetic import SyntheticShape, write_synthetic

    shape = SyntheticShape(
        n_layer=2, n_embd=256, n_ff_exp=256, n_expert=8, n_expert_used=2, head_dim=64, quant="q4_0"
    )
    model = write_synthetic(tmp_path / "q4_0.gguf", shape, seed=5, progress=False)
    folder = tmp_path / "store"
    store = folder / "q4_0.experts"
    assert store_command(["-m", str(model), "--out", str(store)]) == 0
    out = _child(model, folder, tmp_path, policy, str(store))
    assert out["store"] == str(store)
    first, again = out["errors"]
    assert first is not None and first[0] == "ExpertReadError" and first[2] is True, first
    pattern = (
        rf"expert read failed: {re.escape(str(store))} at offset \d+ \(blk\.\d+\.ffn_\w+_exps\.weight\): "
    )
    assert re.match(pattern + "Input/output error", first[1]), first[1]
    assert again is not None and again[1] == first[1]
