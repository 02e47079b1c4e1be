"""``python -m bmoe.report FILE.csv``: a short text summary and a PNG of a ``--csv`` run.

The text comes from :func:`summary_text` (pure); the chart from :mod:`bmoe.report.chart`,
which needs matplotlib (``.venv/bin/pip install -e '.[bench]'`` from a checkout).
"""

from __future__ import annotations

from bmoe.report.text import summary_text

__all__ = ["summary_text"]
