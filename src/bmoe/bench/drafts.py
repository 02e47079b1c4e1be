"""``python -m bmoe.bench --draft copy``: what copy drafts cost and save, in three measures.

1. **Acceptance, the model's own choices** (resident, no limits): greedy answers to
   edit-shaped prompts with drafts on and off (``draft_child.run_accept``): tokens a verify,
   and whether the answers are the same tokens (a difference with its logit margin).
2. **What a verify batch reads** (streamed, expert cache off, no limits: bytes are counted,
   not timed): MiB read by batches of ``n`` consecutive reply tokens of the agent-edit
   transcript (``draft_child.run_union``), and from them the MiB a generated token costs for
   a draft of ``d`` tokens of which ``a`` are accepted: ``U(d + 1) / (a + 1)``.
3. **End to end** (streamed under ``--mem-limit-mb`` and ``--disk-mib-s``, the first of
   ``--budgets``): each transcript (``draft_texts``) teacher-forced with drafts off and on, in
   turn (off, on, off, on over ``--rounds``), each run in a fresh process in the groups:
   decode tok/s, MiB read a generated token, tokens a verify; the ratio on/off is each
   round's pair, then their median.

Figures come from the model the bench runs (``--model-kind trained`` is the one whose
routing was learned); the reply is the transcript's, not the model's (teacher-forced
acceptance), except in the first measure.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from bmoe.bench import configs as cf
from bmoe.bench.confinement import confinement_factory
from bmoe.bench.draft_texts import Transcript, agent_edit, transcripts
from bmoe.bench.io_group import DiskThrottle
from bmoe.bench.progress import make_progress
from bmoe.bench.run_plan import parse_batch

UNION_SIZES = (1, 2, 4, 9, 17, 33, 64)  # rows a batch: the current token and a draft of 0..63
UNION_TOKENS = 195  # reply tokens fed per batch size: 3 batches of 65 (cache off reads a lot)
MIB = 1 << 20


def _n_ctx(*lengths: int) -> int:
    need = sum(lengths) + 64
    return max(256, -(-need // 256) * 256)


def run_drafts(args: argparse.Namespace, model: Path, argv: list[str]) -> int:
    from bmoe.bench.model import expert_bytes, tokenize
    from bmoe.bench.runner import run_configuration

    throttle = DiskThrottle(args.disk_mib_s, args.disk_iops)
    make_group = confinement_factory(model, args.mem_limit_mb, throttle)
    experts = expert_bytes(model)
    cache_mib = cf.parse_budgets(args.budgets)[0].resolve_mib(experts)
    texts = [(t, tokenize(model, t.prompt), tokenize(model, t.reply)) for t in transcripts()]
    edit = agent_edit()
    edit_prompt, edit_reply = texts[0][1], texts[0][2]
    base = {
        "model": str(model),
        "threads": args.threads,
        "io_threads": args.io_threads,
        "max_seconds": args.max_seconds,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    fed = sum(len(p) + min(args.tokens, len(r) - args.warmup) + args.warmup for _, p, r in texts)
    progress = make_progress(2 * args.rounds * fed)
    t0 = time.perf_counter()
    results: dict[str, Any] = {}

    def child(spec: dict[str, Any], label: str, group: bool, fed: int = 0) -> dict[str, Any]:
        progress.begin(label, fed)
        r = run_configuration(
            spec,
            model=model,
            make_group=make_group if group else None,
            timeout_s=args.timeout,
            on_progress=progress.update,
            log_path=args.out / "logs" / f"{spec['key']}.log",
        )
        progress.end(f"{label}: " + (f"failed: {r['error']}" if "error" in r else "done"))
        (args.out / "drafts-partial.json").write_text(json.dumps(results | {spec["key"]: r}, indent=1))
        return r

    try:
        accept_prompts = _accept_prompts(edit)
        results["accept"] = child(
            base
            | {
                "key": "drafts-accept",
                "mode": "accept",
                "prompts": accept_prompts,
                "measure": args.tokens,
                "n_ctx": _n_ctx(len(edit_prompt), len(edit_reply), args.tokens),
            },
            "1/3 acceptance (resident, the model's own choices)",
            group=False,
        )
        results["union"] = child(
            base
            | {
                "key": "drafts-union",
                "mode": "union",
                "prompt_ids": edit_prompt,
                "reply_ids": edit_reply,
                "sizes": list(UNION_SIZES),
                "measure": min(UNION_TOKENS, len(edit_reply)),  # every size gets whole batches
                "n_ctx": _n_ctx(len(edit_prompt), len(edit_reply)),
            },
            "2/3 verify batches' reads (streamed, cache off)",
            group=False,
        )
        runs: list[dict[str, Any]] = []
        for round_no in range(args.rounds):
            for transcript, prompt, reply in texts:
                measure = min(args.tokens, len(reply) - args.warmup)
                for draft in ("off", "copy"):
                    key = f"drafts-{transcript.name.replace(' ', '-')}-{draft}-round{round_no + 1}"
                    r = child(
                        base
                        | {
                            "key": key,
                            "kind": "stream",
                            "cache_mib": cache_mib,
                            "tokens": prompt + reply,
                            "prompt_tokens": len(prompt),
                            "batch": parse_batch(args.batch_size),
                            "warmup": args.warmup,
                            "measure": measure,
                            "n_ctx": _n_ctx(len(prompt), len(reply)),
                            "repack": not args.no_repack,
                            "draft": draft,
                        },
                        f"3/3 round {round_no + 1}: {transcript.name}, drafts {draft}",
                        group=True,
                        fed=len(prompt) + args.warmup + measure,
                    )
                    runs.append({"transcript": transcript.name, "draft": draft, "round": round_no} | r)
        results["end_to_end"] = runs
    finally:
        progress.close()
    results["command"] = shlex.join(["python", "-m", "bmoe.bench", *argv])
    results["cache_mib"] = cache_mib
    results["wall_s"] = time.perf_counter() - t0
    md = markdown(results, model, args, throttle, cache_mib)
    (args.out / "drafts.json").write_text(json.dumps(results, indent=1))
    (args.out / "drafts.md").write_text(md)
    print(md)
    print(f"bench: wrote {args.out / 'drafts.json'}, {args.out / 'drafts.md'}", file=sys.stderr)
    failed = [r for r in [results["accept"], results["union"], *results["end_to_end"]] if "error" in r]
    return 1 if failed else 0


def _accept_prompts(edit: Transcript) -> list[tuple[str, str]]:
    """Edit-shaped prompts the model continues itself: inside an ``old_str`` that copies the
    file it read, and at a ``new_str`` that should repeat the ``old_str`` with a change."""
    head = edit.reply.split('new_str="', 1)[0]
    return [
        ("copying old_str from the file", edit.prompt + edit.reply[: edit.reply.index("old_str=") + 40]),
        ("new_str repeating old_str", edit.prompt + head + 'new_str="'),
    ]


def markdown(
    results: dict[str, Any], model: Path, args: argparse.Namespace, throttle: DiskThrottle, cache_mib: int
) -> str:
    from bmoe.bench.draft_report import accept_table, end_to_end_table, union_tables

    lines = [
        f"## Copy drafts on {model.name}",
        "",
        f"`{results['command']}`",
        "",
        "### 1. Acceptance: the model's own greedy choices (resident)",
        "",
        *accept_table(results["accept"]),
        "",
        "### 2. What a verify batch reads (streamed, expert cache off; teacher-forced rows)",
        "",
        *union_tables(results["union"]),
        "",
        f"### 3. End to end: streamed, cache {cache_mib} MiB"
        + (f", memory limit {args.mem_limit_mb} MiB" if args.mem_limit_mb else "")
        + (f", disk {throttle.text()}" if throttle.active else "")
        + " (teacher-forced acceptance)",
        "",
        *end_to_end_table(results["end_to_end"]),
    ]
    return "\n".join(lines) + "\n"
