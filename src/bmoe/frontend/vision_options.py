"""``--mmproj`` and the image flags, as llama.cpp names them (docs/models.md, "Images")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


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


def vision_fields(args: argparse.Namespace, mmproj: Path | None) -> dict[str, Any]:
    """``SessionConfig``'s vision fields from the flags (``mmproj``: the file resolved)."""
    return {
        "mmproj": mmproj,
        "image_min_tokens": getattr(args, "image_min_tokens", -1),
        "image_max_tokens": getattr(args, "image_max_tokens", -1),
    }
