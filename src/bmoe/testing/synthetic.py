"""Moved to :mod:`bmoe.tinymodel.synthetic` (product code: ``python -m bmoe.bench`` makes its
model with it); re-exported here for existing users, ``python -m bmoe.testing.synthetic``
included."""

from __future__ import annotations

import sys

from bmoe.tinymodel.synthetic import (
    ARCH,
    QK,
    QUANTS,
    PlannedTensor,
    QuantFormat,
    SyntheticShape,
    main,
    plan_tensors,
    quantized_random,
    write_synthetic,
)

__all__ = [
    "ARCH",
    "QK",
    "QUANTS",
    "PlannedTensor",
    "QuantFormat",
    "SyntheticShape",
    "main",
    "plan_tensors",
    "quantized_random",
    "write_synthetic",
]

if __name__ == "__main__":
    sys.exit(main())
