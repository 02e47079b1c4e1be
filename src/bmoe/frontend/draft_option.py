"""``--draft copy|off``: copy drafts (docs/streaming.md, "Copy drafts")."""

from __future__ import annotations

import argparse

DRAFT_MODES = ("copy", "off")


def add_draft_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--draft",
        choices=DRAFT_MODES,
        default="off",
        help="copy: where a greedy reply repeats its own context (an edit's old text, a patch's "
        "context lines), verify a long draft copied from it in one batch, which reads the "
        "union of its experts once; a gate stops drafting in a request where it does not pay. "
        "Greedy tokens may differ from off at a near-tie (a batch's logits are not a single "
        "step's); streamed equals resident. Default: off",
    )
