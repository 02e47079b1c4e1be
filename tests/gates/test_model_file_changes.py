"""A model file changed under a resident session: truncated in place is a clear fatal error
before any compute touches the lost pages (never a SIGBUS), replaced or deleted is harmless
(the mapping keeps the old file). The streamed cases are in test_streaming_faults.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from bmoe.adapters.llama import ContextParams
from bmoe.domain.generation import GenerateRequest
from bmoe.errors import ModelFileTruncatedError, SessionFailedError
from bmoe.runtime import Session, SessionConfig

TinyModel = Callable[[str], Path]
PARAMS = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=2)
REQUEST = GenerateRequest("The quick brown fox", n_predict=4)


@pytest.fixture
def model_copy(tiny_model_path: TinyModel, tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_model_path("qwen3moe"), path)
    return path


def test_a_file_truncated_under_a_resident_session_is_a_fatal_error_not_a_crash(model_copy: Path) -> None:
    with Session.open(SessionConfig(model_path=model_copy, context=PARAMS)) as s:
        s.generate(REQUEST)
        with open(model_copy, "r+b") as f:
            f.truncate(model_copy.stat().st_size // 2)
        with pytest.raises(ModelFileTruncatedError, match="truncated under the session"):
            s.generate(REQUEST)
        with pytest.raises(SessionFailedError):
            s.perplexity("The quick brown fox jumps")


@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_a_file_replaced_or_deleted_under_a_resident_session_changes_nothing(
    model_copy: Path, tiny_model_path: TinyModel, change: str
) -> None:
    with Session.open(SessionConfig(model_path=model_copy, context=PARAMS)) as s:
        before = s.generate(REQUEST).tokens
        model_copy.unlink()
        if change == "replaced":
            shutil.copy(tiny_model_path("gpt-oss"), model_copy)  # another model at the same path
        assert s.generate(REQUEST).tokens == before
