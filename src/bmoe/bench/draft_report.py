"""The tables of ``bench --draft copy`` (``bmoe.bench.drafts``): figures in, markdown lines
out. A measure that failed is one line saying so."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

MIB = 1 << 20
DRAFT_LENGTHS = (8, 16, 32, 63)  # 63: the longest draft a 64-row ubatch verifies
ACCEPTED_SHARES = (0.0, 0.25, 0.5, 1.0)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _failed(result: dict[str, Any]) -> list[str] | None:
    return [f"failed: {result['error']}"] if "error" in result else None


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def accept_table(result: dict[str, Any]) -> list[str]:
    if (failed := _failed(result)) is not None:
        return failed
    rows = []
    for r in result["accept"]:
        same = "yes" if r["same"] else f"no: first at token {r['first_difference']}"
        if "margin" in r:
            same += f" (margin {r['margin']:.4f})"
        rows.append(
            [
                r["name"],
                str(r["tokens"]),
                f"{r['verifies']}",
                f"{r['accepted']} of {r['drafted']}",
                f"{r['per_verify']:.2f}",
                " / ".join(f"{x:.1f}" for x in r["tok_s_off"]),
                " / ".join(f"{x:.1f}" for x in r["tok_s_on"]),
                same,
            ]
        )
    head = [
        "prompt",
        "tokens",
        "verifies",
        "drafted tokens accepted",
        "tokens a verify",
        "tok/s off (2 runs)",
        "tok/s on (2 runs)",
        "same tokens as off",
    ]
    return _table(head, rows)


def union_tables(result: dict[str, Any]) -> list[str]:
    """The MiB a batch of n rows reads, then the MiB a generated token costs for drafts of
    ``DRAFT_LENGTHS`` tokens at ``ACCEPTED_SHARES`` of them accepted."""
    if (failed := _failed(result)) is not None:
        return failed
    union = {u["rows"]: u for u in result["union"]}
    one = union[1]["mib_per_batch"]
    rows = [
        [
            str(n),
            str(u["batches"]),
            f"{u['mib_per_batch']:.1f}",
            f"{u['mib_per_row']:.2f}",
            f"{u['mib_per_batch'] / one:.2f}x",
            f"{1000 * u['s_per_batch']:.0f}",
        ]
        for n, u in sorted(union.items())
    ]
    out = _table(
        ["rows a batch", "batches", "MiB a batch (the union)", "MiB a row", "batch vs 1 row", "ms a batch"],
        rows,
    )
    cost = []
    for d in DRAFT_LENGTHS:
        u = union.get(d + 1)
        if u is None:
            continue
        cells = [f"{u['mib_per_batch'] / (round(share * d) + 1):.1f}" for share in ACCEPTED_SHARES]
        cost.append([str(d), *cells])
    out += [
        "",
        f"MiB read a generated token, one token a step: {one:.1f}. With a draft of d tokens of which "
        "a are accepted, a verify reads the union of d + 1 rows and emits a + 1 tokens:",
        "",
        *_table(["draft d", *(f"a = {share:.0%} of d" for share in ACCEPTED_SHARES)], cost),
    ]
    return out


def _figures(r: dict[str, Any]) -> tuple[float, float | None]:
    """A run's decode tok/s and MiB read a generated token (None where it did not stream)."""
    counters = r.get("counters")
    mib = (
        counters["bytes_read"] / MIB / r["measured_tokens"] if counters and r.get("measured_tokens") else None
    )
    return r.get("tok_s", 0.0), mib


def end_to_end_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    rows = []
    for name in dict.fromkeys(r["transcript"] for r in runs):
        pairs: dict[int, dict[str, dict[str, Any]]] = {}
        for r in runs:
            if r["transcript"] == name:
                pairs.setdefault(r["round"], {})[r["draft"]] = r
        for draft in ("off", "copy"):
            mine = [p[draft] for p in pairs.values() if draft in p]
            bad = [r for r in mine if "error" in r]
            if bad:
                rows.append([name, draft, f"failed: {bad[0]['error']}", "", "", "", "", ""])
                continue
            tok_s = [_figures(r)[0] for r in mine]
            mib = [m for r in mine if (m := _figures(r)[1]) is not None]
            drafts = [r["drafts"] for r in mine if "drafts" in r]
            verify = "–"
            if drafts:
                v = sum(d["verifies"] for d in drafts)
                acc, drafted = sum(d["accepted"] for d in drafts), sum(d["drafted"] for d in drafts)
                paused = sum(d["paused"] for d in drafts)
                verify = (
                    f"{(acc + v) / v:.2f} ({acc} of {drafted} accepted, paused {paused})" if v else "none"
                )
            ratio_tok, ratio_mib, same = "", "", ""
            if draft == "copy":
                both = [p for p in pairs.values() if "off" in p and "copy" in p]
                both = [p for p in both if "error" not in p["off"] and "error" not in p["copy"]]
                ratio_tok = f"{_median([_figures(p['copy'])[0] / _figures(p['off'])[0] for p in both]):.2f}x"
                mibs = [(_figures(p["copy"])[1], _figures(p["off"])[1]) for p in both]
                ratio_mib = f"{_median([a / b for a, b in mibs if a is not None and b]):.2f}x"
                same = ", ".join(_same_choices(p["off"], p["copy"]) for p in both)
            rows.append(
                [
                    name,
                    draft,
                    " / ".join(f"{x:.2f}" for x in tok_s),
                    " / ".join(f"{x:.1f}" for x in mib) or "–",
                    verify,
                    ratio_tok,
                    ratio_mib,
                    same,
                ]
            )
    head = [
        "transcript",
        "drafts",
        "decode tok/s (each round)",
        "MiB read a token",
        "tokens a verify",
        "tok/s vs off (median of pairs)",
        "MiB a token vs off",
        "greedy choices as off",
    ]
    return _table(head, rows)


def _same_choices(off: dict[str, Any], copy: dict[str, Any]) -> str:
    """Position by position, the greedy choice after each fed token in both runs."""
    a, b = off.get("argmax", []), copy.get("argmax", [])
    n = min(len(a), len(b))
    differ = sum(1 for i in range(n) if a[i] != b[i])
    return f"{n - differ} of {n} equal"
