"""``-hf``: which files a spec names (llama.cpp's rule), and a model resolved from a local
Hugging Face cache with the Hub unreachable (``HF_HUB_OFFLINE=1``): a cache laid out as
``huggingface_hub`` lays it out, holding a generated GGUF, split shards and a projector."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bmoe.domain.hf_models import HfSpec, pick_files
from bmoe.errors import ConfigError

FILES = [
    "README.md",
    "Qwen3-30B-A3B-Q8_0.gguf",
    "Qwen3-30B-A3B-Q4_K_M.gguf",
    "mmproj-Qwen3-F16.gguf",
    "BF16/Qwen3-30B-A3B-BF16-00002-of-00002.gguf",
    "BF16/Qwen3-30B-A3B-BF16-00001-of-00002.gguf",
]


@pytest.mark.parametrize(
    ("spec", "chosen"),
    [
        ("unsloth/Qwen3-30B-A3B-GGUF", ["Qwen3-30B-A3B-Q4_K_M.gguf"]),  # the default quant
        ("unsloth/Qwen3-30B-A3B-GGUF:q8_0", ["Qwen3-30B-A3B-Q8_0.gguf"]),  # any case
        (
            "unsloth/Qwen3-30B-A3B-GGUF:BF16",
            ["BF16/Qwen3-30B-A3B-BF16-00001-of-00002.gguf", "BF16/Qwen3-30B-A3B-BF16-00002-of-00002.gguf"],
        ),
    ],
)
def test_a_spec_names_its_quant_or_q4_k_m_and_every_shard_first_first(spec: str, chosen: list[str]) -> None:
    assert pick_files(HfSpec.parse(spec), FILES) == chosen


def test_without_q4_k_m_the_first_model_file_and_never_a_projector() -> None:
    assert pick_files(HfSpec("a/b"), ["mmproj-x.gguf", "x-Q8_0.gguf", "x-IQ2_M.gguf"]) == ["x-IQ2_M.gguf"]


@pytest.mark.parametrize("spec", ["noslash", "a/b/c", "/b", "a/"])
def test_a_spec_that_is_not_user_repo_is_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match="USER/REPO"):
        HfSpec.parse(spec)


def test_an_absent_quant_names_what_the_repository_has() -> None:
    with pytest.raises(ConfigError, match=r"no GGUF file for 'Q2_K'.*Q8_0"):
        pick_files(HfSpec("a/b", "Q2_K"), FILES)


def _hub_cache(root: Path, repo: str, files: dict[str, Path]) -> Path:
    """``root`` laid out as huggingface_hub's cache: ``models--user--name`` with a blob per
    file, a snapshot of links to them and ``refs/main`` naming the snapshot."""
    folder = root / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    for name, source in files.items():
        blob = (
            folder
            / "blobs"
            / f"blob{len(list((folder / 'blobs').glob('*'))) if (folder / 'blobs').exists() else 0}"
        )
        blob.parent.mkdir(exist_ok=True)
        shutil.copyfile(source, blob)
        link = folder / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return folder / "snapshots" / commit


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("huggingface_hub")
    from bmoe.testing.fixtures import fixture_path

    model = fixture_path("qwen3moe")
    snapshot = _hub_cache(
        tmp_path / "hub",
        "someone/tiny-moe-GGUF",
        {"tiny-moe-Q8_0.gguf": model, "tiny-moe-Q4_K_M.gguf": model, "mmproj-tiny.gguf": model},
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """In a child: huggingface_hub reads HF_HUB_OFFLINE and HF_HUB_CACHE when imported."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env=os.environ
    )


def test_hf_resolves_from_an_offline_cache_and_the_cli_runs_it(offline_hub: Path) -> None:
    code = (
        "from bmoe.runtime import SessionConfig\n"
        "print(SessionConfig.from_hf('someone/tiny-moe-GGUF').model_path)\n"
        "print(SessionConfig.from_hf('someone/tiny-moe-GGUF:Q8_0').model_path)\n"
    )
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        str(offline_hub / "tiny-moe-Q4_K_M.gguf"),
        str(offline_hub / "tiny-moe-Q8_0.gguf"),
    ]
    proc = _run("-m", "bmoe.cli", "-hf", "someone/tiny-moe-GGUF", "--no-mmproj", "-p", "Hello", "-n", "4")
    assert proc.returncode == 0, proc.stderr
    assert "generation: 4 tokens" in proc.stderr


def test_hf_fetches_the_repositorys_mmproj_beside_the_model(offline_hub: Path) -> None:
    """As llama.cpp's -hf: the repository's mmproj comes with the model (here a text model
    under an mmproj's name, which the vision encoder refuses by name)."""
    proc = _run("-m", "bmoe.cli", "-hf", "someone/tiny-moe-GGUF", "-p", "Hello", "-n", "4")
    assert proc.returncode == 1
    assert "bmoe: error: mmproj-tiny.gguf is not a vision encoder for this model" in proc.stderr


def test_hf_names_the_cache_when_a_model_is_neither_there_nor_reachable(offline_hub: Path) -> None:
    proc = _run("-m", "bmoe.cli", "-hf", "someone/absent-GGUF", "-p", "Hello", "-n", "4")
    assert proc.returncode != 0
    assert "someone/absent-GGUF is not in the Hugging Face cache" in proc.stderr
    assert str(offline_hub.parents[2]) in proc.stderr


def test_the_mmproj_picked_is_f16_where_several_are_offered() -> None:
    from bmoe.domain.hf_models import pick_mmproj

    files = ["model-Q4_K_M.gguf", "mmproj-model-Q8_0.gguf", "mmproj-model-F16.gguf", "README.md"]
    assert pick_mmproj(files) == "mmproj-model-F16.gguf"
    assert pick_mmproj(["model-Q4_K_M.gguf", "sub/mmproj-x.gguf"]) == "sub/mmproj-x.gguf"
    assert pick_mmproj(["model-Q4_K_M.gguf"]) is None
