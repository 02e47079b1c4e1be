"""A long prompt under a memory limit and a slow disk: how many times the prefill reads the
experts, how long it takes, how much memory it took (issue 46's table).

Each configuration runs in a fresh process, in a memory cgroup of ``--mem-limit-mb`` and a
disk throttle of ``--disk-mib-s`` (the bench's groups, ``bmoe.bench.confinement.confinement_factory``),
the model dropped from the page cache first; the configurations interleave, round after round. The
prompt is the first ``--prompt-tokens`` tokens of held-out text (the trained bench model's
held-out corpus, ``bmoe.bench.trained.corpus``: never trained on), one answer token after it.

- ``bmoe``: ``python -m bmoe.cli --moe-stream`` with the default flags (the prompt batch
  sized from the room); ``bmoe-b512``: the same with ``-b 512`` (the default before);
  ``bmoe-fa``: with ``-fa on``;
- ``resident``: bmoe resident at the batch the default chose, outside the groups, the model
  in the page cache (read once before): the prefill's compute alone;
- ``stock``: llama-cpp-python's ``Llama`` with its defaults (mmap, ``n_batch`` 512, flash
  attention off) in the same groups, timing ``eval`` of the prompt.

    python tools/bench_long_prompt.py -m model.gguf --prompt-tokens 2048 --mem-limit-mb 2048 \\
        --disk-mib-s 400 --rounds 2 --configs bmoe,bmoe-b512,resident,stock

Prints one markdown row per run and the medians. Time figures move with the machine: run
nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs

from bmoe.adapters.llama import LlamaModel
from bmoe.bench.confinement import confinement_factory
from bmoe.bench.disk import drop_from_page_cache
from bmoe.bench.io_group import Confinement, DiskThrottle
from bmoe.bench.trained.corpus import machine_corpus

MIB = 1 << 20
BMOE_FLAGS = {"bmoe": [], "bmoe-b512": ["-b", "512"], "bmoe-fa": ["-fa", "on"]}
STOCK = """
import sys, time, llama_cpp
text = open(sys.argv[2]).read()
llm = llama_cpp.Llama(sys.argv[1], n_ctx=int(sys.argv[3]), n_threads=int(sys.argv[4]), verbose=False)
tokens = llm.tokenize(text.encode(), add_bos=True)
t0 = time.perf_counter()
llm.eval(tokens)
print(f"timing: prefill {len(tokens)} tokens in {time.perf_counter() - t0:.3f} s", file=sys.stderr)
"""


@attrs.frozen
class Run:
    config: str
    round: int
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    read_mib: float = 0.0
    passes: float = 0.0
    batch: str = ""
    peak_mib: float = 0.0
    killed: bool = False

    def row(self) -> str:
        if self.killed:
            return f"| {self.config} | {self.round} | killed for memory | | | | {self.peak_mib:,.0f} |"
        read = f"{self.read_mib:,.0f}" if self.read_mib else ""
        passes = f"{self.passes:.2f}" if self.passes else ""
        return (
            f"| {self.config} | {self.round} | {self.prompt_tokens:,} | {self.batch} | {self.prefill_s:.1f} "
            f"| {read} | {passes} | {self.peak_mib:,.0f} |"
        )


def prompt_text(model: Path, tokens: int) -> str:
    """A prefix of the held-out corpus that tokenizes to about ``tokens`` tokens."""
    text = machine_corpus().held_out
    with LlamaModel(model) as m:
        lo, hi = 0, min(len(text), tokens * 16)
        while hi - lo > 8:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if len(m.tokenize(text[:mid])) < tokens else (lo, mid)
    return text[:lo]


def parse(config: str, rnd: int, stderr: str) -> Run:
    timing = re.search(r"prefill (\d+) tokens in ([\d.]+) s", stderr)
    read = re.search(r"prefill read ([\d.]+) MiB \(the experts ([\d.]+) times over[,)]", stderr)
    batch = re.search(r"prompt batch (\d+)", stderr)
    return Run(
        config,
        rnd,
        prompt_tokens=int(timing.group(1)) if timing else 0,
        prefill_s=float(timing.group(2)) if timing else 0.0,
        read_mib=float(read.group(1)) if read else 0.0,
        passes=float(read.group(2)) if read else 0.0,
        batch=batch.group(1) if batch else ("512" if config == "stock" else ""),
    )


def read_whole(path: Path) -> None:
    with path.open("rb") as f:
        while f.read(64 * MIB):
            pass


def run_one(args: argparse.Namespace, model: Path, text_file: Path, config: str, rnd: int, batch: int) -> Run:
    common = ["-m", str(model), "-c", str(args.ctx), "-t", str(args.threads), "-n", "1", "--temp", "0"]
    prompt = ["-p", text_file.read_text()]
    if config == "resident":
        read_whole(model)  # in the page cache: the prefill's compute alone
        cmd = [sys.executable, "-m", "bmoe.cli", *common, "-b", str(batch), *prompt]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
        return attrs.evolve(parse(config, rnd, done.stderr), batch=str(batch))
    if config == "stock":
        cmd = [sys.executable, "-c", STOCK, str(model), str(text_file), str(args.ctx), str(args.threads)]
    else:
        cmd = [sys.executable, "-m", "bmoe.cli", *common, "--moe-stream", *BMOE_FLAGS[config], *prompt]
    drop_from_page_cache(model)
    make = confinement_factory(model, args.mem_limit_mb, DiskThrottle(args.disk_mib_s))
    with make() if make is not None else Confinement() as groups:
        # the child waits for a line on stdin until it is in the groups: nothing loaded before
        proc = subprocess.Popen(
            ["sh", "-c", 'read _ && exec "$@"', "sh", *cmd],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        groups.add(proc.pid)
        _, stderr = proc.communicate("go\n", timeout=args.timeout)
        peak = (groups.memory.peak_bytes() or 0) / MIB if groups.memory else 0.0
        killed = bool(groups.memory and groups.memory.oom_kills()) or proc.returncode in (-9, 137)
    got = parse(config, rnd, stderr)
    return attrs.evolve(got, peak_mib=peak, killed=killed or not got.prefill_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", type=Path, required=True)
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("-c", "--ctx", type=int, default=0, help="context (default: the prompt + 64, to 256)")
    p.add_argument("--mem-limit-mb", type=int, default=2048)
    p.add_argument("--disk-mib-s", type=int, default=400)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--configs", default="bmoe,bmoe-b512,resident,stock")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=3600)
    args = p.parse_args()
    args.ctx = args.ctx or -(-(args.prompt_tokens + 64) // 256) * 256
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        text_file = Path(tmp) / "prompt.txt"
        text_file.write_text(prompt_text(args.model, args.prompt_tokens))
        print(
            f"{args.model.name}: {args.prompt_tokens} tokens asked, -c {args.ctx}, "
            f"{args.mem_limit_mb} MiB, {args.disk_mib_s} MiB/s, {args.threads} threads"
        )
        print("| config | round | prompt tokens | batch | prefill s | read MiB | passes | peak MiB |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        runs: list[Run] = []
        batch = 512
        for rnd in range(1, args.rounds + 1):
            for config in configs:
                run = run_one(args, args.model, text_file, config, rnd, batch)
                if config == "bmoe" and run.batch:
                    batch = int(run.batch)  # resident runs at the batch the default chose
                runs.append(run)
                print(run.row(), flush=True)
        print()
        for config in configs:
            times = [r.prefill_s for r in runs if r.config == config and not r.killed]
            if times:
                print(f"{config}: median prefill {statistics.median(times):.1f} s over {len(times)} runs")


if __name__ == "__main__":
    main()
