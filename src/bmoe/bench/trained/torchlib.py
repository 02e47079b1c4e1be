"""torch, imported on demand: an optional extra (``.venv/bin/pip install -e '.[train]'``).

The numpy parts of this package never import it. Where it is used it comes through
:func:`load_torch` as a plain module object, so mypy neither needs torch installed (CI has
none) nor reads its stubs: the tensors of the torch modules are typed ``Any``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from bmoe.errors import BmoeError

Tensor = Any
"""A ``torch.Tensor`` (untyped here: see the module docstring)."""

INSTALL_HINT = (
    "python -m bmoe.bench.trained needs torch: .venv/bin/pip install -e '.[train]' "
    "(from a checkout of bmoe), or for the smaller CPU-only build: pip install torch --index-url https://download.pytorch.org/whl/cpu"
)


class TorchMissingError(BmoeError, ImportError):
    """torch is not installed."""


def load_torch() -> ModuleType:
    """The ``torch`` module; ``TorchMissingError`` saying how to install it when absent.

    Unless the environment says otherwise, torch's OpenMP threads are made to sleep rather
    than spin while they wait (``OMP_WAIT_POLICY=PASSIVE``, read once when torch loads): on
    a machine whose cores other processes also use, spinning threads burned twenty times the
    CPU of the work itself and made a training step over twenty times slower.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise TorchMissingError(INSTALL_HINT) from exc
