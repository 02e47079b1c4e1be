"""The plan's calibrations kept (``bmoe.domain.plan.compute_spread``):
``<bmoe's cache root>/plan-calibrations.json`` (``$BMOE_CALIBRATION_HISTORY`` names another
file), a JSON document of ``CalibrationRecord`` records. Best effort both ways: a file that
cannot be read or is not such a document is no history, and one that cannot be written is
left as it was (a plan never fails for it; it then carries the calibration's own spread)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import cattrs

from bmoe.adapters.cache_dirs import cache_root
from bmoe.adapters.file_writes import make_folder, write_file
from bmoe.domain.plan.compute_spread import CalibrationRecord
from bmoe.errors import FileNotKeptError

VERSION = 1
ENV_FILE = "BMOE_CALIBRATION_HISTORY"
_CONVERTER = cattrs.Converter(forbid_extra_keys=True)


def history_path() -> Path:
    configured = os.environ.get(ENV_FILE)
    return Path(configured) if configured else cache_root() / "plan-calibrations.json"


def read_history(path: Path) -> tuple[CalibrationRecord, ...]:
    """The records kept at ``path``; none where there is no readable history there."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            return ()
        return tuple(_CONVERTER.structure(doc["records"], list[CalibrationRecord]))
    except (OSError, ValueError, KeyError, TypeError, cattrs.BaseValidationError):
        return ()  # ValueError: JSON's and UTF-8's decode errors


def write_history(path: Path, records: tuple[CalibrationRecord, ...]) -> bool:
    """Keep ``records`` at ``path``; False where the disk refused (nothing changed there)."""
    doc = {"version": VERSION, "records": _CONVERTER.unstructure(list(records))}
    with contextlib.suppress(FileNotKeptError):
        make_folder(path.parent, "the plan's calibrations")
        write_file(path, json.dumps(doc, indent=1) + "\n", "the plan's calibrations")
        return True
    return False
