"""The fixtures' bytes are pinned: a generator change that alters any fixture must bump
``GENERATOR_VERSION`` (cached builds live in ``v{GENERATOR_VERSION}/``, so a stale cache would
otherwise hold other bytes than a fresh build) and add that version's digests here.

The digests of the fixtures that existed before the architecture fixtures were added
(``qwen3moe`` ... ``qwen3moe-think``) are those version 1 always had.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bmoe.testing.fixtures import (
    DENSE_FIXTURES,
    FIXTURES,
    GENERATOR_VERSION,
    SCRIPTED_FIXTURES,
    build_fixture,
    fixture_files,
)

DIGESTS: dict[int, dict[str, tuple[str, ...]]] = {
    1: {
        "qwen3moe": ("734ae6ac8f7a1252",),
        "qwen35moe": ("ffb6b1c53b46e250",),
        "gpt-oss": ("8df82997bfcea0a7",),
        "qwen3moe-odd": ("0eed20269c3501c0",),
        "qwen3moe-split": ("ef968f244bb8c5a3", "1d66c869395dae4d", "dc775f40a81e7ff2"),
        "qwen3moe-think": ("2a0a3e0c6fecd12e",),
        "qwen2moe": ("50d4c3d7fbb4ef5b",),
        "olmoe": ("90dddff482ea5116",),
        "mixtral": ("40f87205e82b68fc",),
        "deepseek2": ("9315f0ffc2ad8288",),
        "glm4moe": ("9165b5d70b8eaa6c",),
        "gemma4": ("0f10e7339db18fc9",),
        "granitemoe": ("1e1bc26e71814256",),
        "dots1": ("9b9d1c293b86178f",),
        "hunyuan-moe": ("6d5358c956b185ee",),
        "bailingmoe2": ("f4c4f6870ad0dfe3",),
        "ernie4_5-moe": ("afc8e7b4096817b6",),
        "qwen3vlmoe": ("9ccae14ade1ffbab",),
        "llama-dense": ("2ee5b06fd97a0b08",),
    }
}
"""Per generator version, per fixture: the first 16 hex digits of each file's sha256 (seed 0)."""

ALL = [*FIXTURES, *SCRIPTED_FIXTURES, *DENSE_FIXTURES]


def test_every_fixture_of_this_generator_version_has_pinned_digests() -> None:
    assert GENERATOR_VERSION in DIGESTS, "new generator version: pin its digests"
    assert sorted(DIGESTS[GENERATOR_VERSION]) == sorted(ALL)


@pytest.mark.parametrize("name", ALL)
def test_a_fresh_build_has_the_pinned_bytes(name: str, tmp_path: Path) -> None:
    build_fixture(name, tmp_path, seed=0)
    digests = tuple(hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in fixture_files(name, tmp_path))
    assert digests == DIGESTS[GENERATOR_VERSION][name], (
        f"{name}'s bytes changed: bump GENERATOR_VERSION and pin the new digests"
    )
