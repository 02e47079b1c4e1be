"""What ``python -m bmoe.plan --verify`` measured, kept for the next plan of the same model
here: ``<bmoe's cache root>/plan-runs/<model key>.json`` (the usage profile's content key:
a renamed or copied file keeps its runs), a JSON document of ``VerifiedRun`` records, the
newest ``KEPT_RUNS``. Written by bmoe's one rule (``bmoe.adapters.file_writes``); a file that
cannot be read, or is not such a document, is no runs (said once by ``read_runs``' caller
through the exception it returns), never trusted in part."""

from __future__ import annotations

import json
from pathlib import Path

import cattrs

from bmoe.adapters.cache_dirs import cache_root
from bmoe.adapters.file_writes import make_folder, write_file
from bmoe.domain.plan.verified import VerifiedRun

VERSION = 1
_CONVERTER = cattrs.Converter(forbid_extra_keys=True)


def runs_path(key: str) -> Path:
    return cache_root() / "plan-runs" / f"{key}.json"


def read_runs(path: Path) -> tuple[VerifiedRun, ...]:
    """The runs kept at ``path``; none where there is no file. ``ValueError`` for a file
    that is not a runs document of this version (the caller plans without it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise ValueError(f"{path}: not a version-{VERSION} plan-runs file")
        return tuple(_CONVERTER.structure(doc["runs"], list[VerifiedRun]))
    except (KeyError, TypeError, json.JSONDecodeError, cattrs.BaseValidationError) as exc:
        raise ValueError(f"{path}: not a plan-runs file ({exc})") from exc


def write_runs(path: Path, runs: tuple[VerifiedRun, ...]) -> None:
    """Keep ``runs`` at ``path`` (``FileNotKeptError`` where the disk refuses)."""
    doc = {"version": VERSION, "runs": _CONVERTER.unstructure(list(runs))}
    make_folder(path.parent, "the plan's measured runs")
    write_file(path, json.dumps(doc, indent=1) + "\n", "the plan's measured runs")
