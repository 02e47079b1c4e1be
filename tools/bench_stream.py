#!/usr/bin/env python
"""Replaced by ``python -m bmoe.bench`` (docs/benchmarks.md says how to run it).

A thin wrapper for old command lines: a positional MODEL becomes ``-m MODEL``,
``--cgroup-mib N`` becomes ``--mem-limit-mb N`` and ``--repeat N`` becomes ``--rounds N``;
everything else goes to ``python -m bmoe.bench`` as given. The old ``--write-md``,
``--json``, ``--skip`` and ``--reference`` are gone: the bench writes ``bench.json`` and
``bench.md`` into ``--out`` and chooses configurations with ``--configs``.
"""

from __future__ import annotations

import sys

from bmoe.bench.main import main

RENAMED = {"--cgroup-mib": "--mem-limit-mb", "--repeat": "--rounds"}
GONE = ("--write-md", "--json", "--skip", "--reference", "--cgroup-parent")


def translate(argv: list[str]) -> list[str]:
    out: list[str] = []
    for i, arg in enumerate(argv):
        name = arg.split("=", 1)[0]
        if name in GONE:
            raise SystemExit(f"bench_stream.py: {name} is gone; see python -m bmoe.bench --help")
        if name in RENAMED:
            out.append(arg.replace(name, RENAMED[name], 1))
        elif i == 0 and not arg.startswith("-"):
            out += ["-m", arg]
        else:
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main(translate(sys.argv[1:])))
