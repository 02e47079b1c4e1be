"""``python -m bmoe.report FILE.csv [-o OUT.png]``: the text summary on stdout, and a PNG."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bmoe.domain.metrics import MetricsFormatError, parse_metrics
from bmoe.report.chart import ChartUnavailable, draw
from bmoe.report.text import summary_text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.report",
        description="Summarise a per-token metrics file written by python -m bmoe.cli --csv FILE.",
    )
    p.add_argument("csv", type=Path, metavar="FILE.csv", help="a bmoe_metrics v2 file")
    p.add_argument(
        "-o", "--out", type=Path, default=None, metavar="OUT.png", help="the chart (default: FILE.png)"
    )
    p.add_argument("--no-chart", action="store_true", help="the text summary only")
    p.add_argument("--title", default=None, help="the chart's title (default: the model's file name)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        text = args.csv.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"bmoe.report: error: cannot read {args.csv}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        metrics = parse_metrics(text)
    except MetricsFormatError as exc:
        print(f"bmoe.report: error: {args.csv}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(summary_text(metrics))
    if args.no_chart:
        return 0
    out = args.out if args.out is not None else args.csv.with_suffix(".png")
    title = args.title or Path(metrics.config.get("model", str(args.csv))).name
    try:
        draw(metrics, out, title)
    except ChartUnavailable as exc:
        print(f"bmoe.report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"bmoe.report: error: cannot write {out}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"chart: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
