"""``--mmproj`` and the image flags, as llama.cpp names them (docs/models.md, "Images")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bmoe.domain.media.image_keep import DEFAULT_IMAGE_CACHE_MIB


def add_vision_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("images (a vision model's encoder: docs/models.md)")
    g.add_argument(
        "--mmproj",
        type=Path,
        default=None,
        metavar="FILE",
        help="the model's vision encoder (its mmproj GGUF): requests may then carry images, "
        "encoded by it (resident) and decoded by the model (streamed or not). With -hf, the "
        "repository's mmproj is fetched beside the model unless --no-mmproj",
    )
    g.add_argument("--no-mmproj", action="store_true", help="with -hf: do not fetch the repository's mmproj")
    for end, what in (("min", "fewest"), ("max", "most")):
        g.add_argument(
            f"--image-{end}-tokens",
            type=int,
            default=-1,
            metavar="N",
            help=f"the {what} tokens an image takes, for encoders of dynamic resolution "
            "(default: the mmproj's own)",
        )
    g.add_argument(
        "--image-cache-mb",
        type=int,
        default=DEFAULT_IMAGE_CACHE_MIB,
        metavar="MB",
        help="the most the vision encoder keeps of the images it has seen (their embeddings, "
        "and the pictures to encode again), so that a conversation's earlier images are not "
        f"decoded and encoded again with every turn; counted in the memory room (default: "
        f"{DEFAULT_IMAGE_CACHE_MIB}; 0: keep a turn's own only)",
    )


def vision_fields(args: argparse.Namespace, mmproj: Path | None) -> dict[str, Any]:
    """``SessionConfig``'s vision fields from the flags (``mmproj``: the file resolved)."""
    return {
        "mmproj": mmproj,
        "image_min_tokens": getattr(args, "image_min_tokens", -1),
        "image_max_tokens": getattr(args, "image_max_tokens", -1),
        "image_cache_mb": getattr(args, "image_cache_mb", DEFAULT_IMAGE_CACHE_MIB),
    }
