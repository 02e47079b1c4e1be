"""``python -m bmoe.plan [-m FILE | -hf USER/REPO[:QUANT]]``: the plan's table (``--json``:
its figures). Without a model, the built-in one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bmoe.domain.plan.document import to_json
from bmoe.domain.plan.predict import DEFAULT_PROMPT_TOKENS, PlanSettings
from bmoe.errors import BmoeError
from bmoe.plan.table import render
from bmoe.plan.verify import VerifyOptions, verify
from bmoe.runtime.planning import MachineOptions, PlannedModel, plan_hf, plan_local


def _cache_mb(text: str) -> int | None:
    return None if text == "auto" else int(text)


def _tokens(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.plan",
        description="Will this MoE model run here, how fast, with which flags: from its GGUF "
        "header (nothing else is downloaded) and this machine.",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("-m", "--model", type=Path, help="a local GGUF (a split model: its first shard)")
    where.add_argument(
        "-hf", "--hf-repo", metavar="USER/REPO[:QUANT]", help="a Hub model: its header(s) only"
    )
    p.add_argument("--hf-file", help="the file of the -hf repository, named outright")
    p.add_argument("-c", "--ctx-size", type=int, help="the context (default: the longest prompt + 4096)")
    p.add_argument(
        "--cache-mb", type=_cache_mb, default=None, help="the expert cache's budget (default auto)"
    )
    p.add_argument("-np", "--parallel", type=int, default=1, help="sequences decoded together")
    p.add_argument("--mem-limit-mb", type=int, help="plan for this memory limit, not this machine's room")
    p.add_argument("--disk-mib-s", type=float, help="the disk's read speed (default: measured, O_DIRECT)")
    p.add_argument(
        "--prompt-tokens",
        type=_tokens,
        default=None,
        help="the prompts to time the prefill of, comma-separated (default 2048,20000; with "
        "--verify, the first is prefilled and timed, and none without this flag)",
    )
    p.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    p.add_argument(
        "--verify",
        action="store_true",
        help="run the plan's flags here (a short teacher-forced decode, and a prefill with "
        "--prompt-tokens; under --mem-limit-mb as a memory group and --disk-mib-s as a disk "
        "throttle) and print predicted beside measured; what it measures is kept for the next "
        "plan of this model here",
    )
    p.add_argument(
        "--knee",
        action="store_true",
        help="with --verify: also decode at 75%%, 50%% and 25%% of the plan's cache, and name the "
        "smallest cache within 10%% of the best decode measured",
    )
    p.add_argument("--verify-out", type=Path, help="with --verify: keep the bench's report in this folder")
    return p


def planned(args: argparse.Namespace) -> PlannedModel:
    settings = PlanSettings(
        n_ctx=args.ctx_size,
        cache_mb=args.cache_mb,
        prompt_tokens=DEFAULT_PROMPT_TOKENS if args.prompt_tokens is None else args.prompt_tokens,
        n_parallel=args.parallel,
    )
    options = MachineOptions(mem_limit_mb=args.mem_limit_mb, disk_mib_s=args.disk_mib_s)
    if args.hf_repo:
        return plan_hf(args.hf_repo, args.hf_file, settings, options)
    return plan_local(model_path(args), settings, options)


def model_path(args: argparse.Namespace) -> Path:
    if args.model is None:
        from bmoe.tinymodel import default_model_path

        return default_model_path()
    return Path(args.model)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.knee and not args.verify:
        p.error("--knee goes with --verify")
    if args.verify and args.hf_repo:
        p.error("--verify runs a model here: -m FILE (or the built-in one), not -hf")
    try:
        result = planned(args)
    except BmoeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.verify:
        print(render(result.plan, result.source))
        options = VerifyOptions(
            prompt_tokens=args.prompt_tokens[0] if args.prompt_tokens else 0,
            mem_limit_mb=args.mem_limit_mb or 0,
            disk_mib_s=args.disk_mib_s or 0.0,
            knee=args.knee,
            out=args.verify_out,
        )
        return verify(result, model_path(args), options)
    if args.json:
        print(json.dumps(to_json(result.plan, result.source), indent=1))
    else:
        print(render(result.plan, result.source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
