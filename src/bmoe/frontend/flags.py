"""The command-line flags ``python -m bmoe.cli`` and ``python -m bmoe.serve`` share, as
argparse groups: the model, the context and placement, expert streaming, decisions, and the
settings of a run (sampling, thinking). One definition, so the two commands cannot drift
apart; ``bmoe.frontend.configs`` reads them into a session's settings."""

from __future__ import annotations

import argparse
from pathlib import Path

from bmoe.adapters.cpu_topology import physical_cores
from bmoe.adapters.llama.context import KV_CACHE_TYPES
from bmoe.adapters.state_files import DEFAULT_CACHE_DISK_MIB
from bmoe.domain.cpu_features import AMX_MODES
from bmoe.domain.decide import PREFIX_CACHE_MODES
from bmoe.domain.prompt_cache import DEFAULT_CACHE_RAM_MIB
from bmoe.domain.slots import DEFAULT_SIMILARITY
from bmoe.domain.streaming import GOVERNOR_MODES, STREAM_POLICIES
from bmoe.domain.streaming.cache_policy import DEFAULT_EVICTION, DEFAULT_HALF_LIFE, EVICTIONS
from bmoe.domain.streaming.usage_profile import WARM_SHARE
from bmoe.domain.streaming.victims import DEFAULT_VICTIMS, VICTIMS_SETTINGS
from bmoe.frontend.draft_option import add_draft_option
from bmoe.frontend.vision_options import add_vision_options


def cache_mb(text: str) -> int | None:
    """``--cache-mb``: a number of MiB, or ``auto`` (None)."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB or 'auto', not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("the cache budget cannot be negative")
    return value


def add_context_options(p: argparse.ArgumentParser) -> None:
    """``-t``, ``-c``, ``-b``, ``-fa`` (the context ``context_params`` builds), ``--no-repack``, ``--amx``,
    the placement group (``-ngl``, ``--device``, ``--rpc``, ...) and ``--n-expert-used``."""
    p.add_argument(
        "-t",
        "--threads",
        type=int,
        default=None,
        help="compute threads (default: one per physical core this process may use, as llama.cpp's "
        f"tools choose; here {physical_cores()})",
    )
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="context length (default: 512)")
    p.add_argument(
        "--cache-ram",
        type=int,
        default=DEFAULT_CACHE_RAM_MIB,
        metavar="MiB",
        help="the prompt cache, as llama.cpp's flag: keep up to this many MiB of conversations' states "
        "in memory when another conversation takes the context, and restore a conversation's state "
        f"when it comes back, so it prefills only its new tokens (0: off, -1: no limit; default: "
        f"{DEFAULT_CACHE_RAM_MIB})",
    )
    p.add_argument(
        "--cache-disk",
        type=Path,
        default=None,
        metavar="DIR",
        help="the prompt cache's disk tier: conversations' states pushed out of --cache-ram (all of "
        "them with --cache-ram 0) are kept as files in DIR, and those in memory are written there at "
        "exit, so a conversation that comes back, even after a restart, prefills only its new tokens; "
        "a corrupt or foreign file is refused with a warning (default: off)",
    )
    p.add_argument(
        "--cache-disk-mb",
        type=int,
        default=DEFAULT_CACHE_DISK_MIB,
        metavar="MiB",
        help=f"at most this many MiB of state files in --cache-disk, least recently used removed first "
        f"(default: {DEFAULT_CACHE_DISK_MIB})",
    )
    p.add_argument(
        "-sps",
        "--slot-prompt-similarity",
        type=float,
        default=DEFAULT_SIMILARITY,
        metavar="F",
        help="with parallel sequences (-np), a request takes the free slot whose kept KV shares the "
        "longest prefix with its prompt when that prefix is at least this share of the prompt, and "
        f"prefills only the rest, as llama.cpp's flag (default: {DEFAULT_SIMILARITY})",
    )
    p.add_argument(
        "-b",
        "--batch-size",
        type=int,
        default=None,
        help="prompt batch and ubatch size (default: 64; with --moe-stream the largest the memory room "
        "allows, up to -c: a long prompt reads the experts once)",
    )
    p.add_argument(
        "-fa",
        "--flash-attn",
        choices=("on", "off", "auto"),
        default="off",
        help="flash attention, as llama.cpp's flag (default: off, the faster on the CPUs measured: "
        "docs/benchmarks.md)",
    )
    for short, name, part in (("-ctk", "--cache-type-k", "K"), ("-ctv", "--cache-type-v", "V")):
        p.add_argument(
            short,
            name,
            choices=tuple(KV_CACHE_TYPES),
            default="f16",
            help=f"the KV cache's {part} type, as llama.cpp's flag (default: f16; a quantized type takes "
            "less memory and changes the output" + ("; needs -fa on or auto" if part == "V" else "") + ")",
        )
    p.add_argument(
        "--no-repack",
        action="store_true",
        help="keep the weights in the file's layout: no CPU_REPACK (stock llama.cpp's default, which "
        "bmoe follows resident and streamed, repacks them for faster kernels)",
    )
    p.add_argument(
        "--amx",
        choices=AMX_MODES,
        default="auto",
        help="llama.cpp's AMX kernels (Intel Xeon): auto uses them where a probe ran the tile "
        "instructions on this machine (some VMs advertise AMX and fault on it); on: wherever "
        "llama.cpp offers them; off: never (weights in CPU_REPACK). Default: auto (docs/machines.md)",
    )
    add_placement_options(p)
    add_template_option(p)
    add_draft_option(p)
    add_vision_options(p)
    p.add_argument(
        "--n-expert-used",
        type=int,
        default=None,
        metavar="K",
        help="run a MoE model with K experts per token instead of its own top-k (lossy; 1..n_expert)",
    )


def add_template_option(p: argparse.ArgumentParser) -> None:
    """``--chat-template-file``, llama.cpp's flag."""
    p.add_argument(
        "--chat-template-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="a Jinja chat template to render chats with, in place of the model's own",
    )


def add_model_options(p: argparse.ArgumentParser) -> None:
    """``-m`` and llama.cpp's ``-hf``/``-hff``: where the model comes from."""
    p.add_argument("-m", "--model", type=Path, help="GGUF file (for a split model: the first shard)")
    p.add_argument(
        "-hf",
        "-hfr",
        "--hf-repo",
        metavar="USER/REPO[:QUANT]",
        default=None,
        help="a GGUF model from the Hugging Face Hub, kept in its cache (quant default Q4_K_M; "
        "needs bmoe[hf]; offline with HF_HUB_OFFLINE=1)",
    )
    p.add_argument(
        "-hff", "--hf-file", metavar="FILE", default=None, help="with -hf: this file of the repository"
    )


def add_placement_options(p: argparse.ArgumentParser) -> None:
    """Where the weights go, as llama.cpp's flags (docs/devices.md)."""
    g = p.add_argument_group("devices: GPUs and llama.cpp RPC servers (docs/devices.md)")
    g.add_argument(
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        type=int,
        default=0,
        metavar="N",
        help="put the dense part of the last N layers on the devices (llama.cpp counts the output "
        "layer as one); with --moe-stream their experts stay on the host, streamed (default: 0)",
    )
    g.add_argument(
        "--device",
        default=None,
        metavar="NAME[,NAME...]",
        help="the devices to use, by name (default: every GPU and RPC device; --list-devices)",
    )
    g.add_argument("--list-devices", action="store_true", help="print the devices (after --rpc) and exit")
    g.add_argument(
        "--rpc",
        default=None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="llama.cpp RPC servers whose devices to use (python -m bmoe.rpc_server starts one)",
    )
    g.add_argument(
        "-cmoe", "--cpu-moe", action="store_true", help="keep every routed expert on the host (resident too)"
    )
    g.add_argument(
        "-ncmoe",
        "--n-cpu-moe",
        type=int,
        default=None,
        metavar="N",
        help="keep the experts of the first N layers on the host (streamed); the experts of offloaded "
        "layers past them stay resident on their device",
    )


def add_stream_options(p: argparse.ArgumentParser) -> None:
    """The ``expert streaming`` group."""
    m = p.add_argument_group("expert streaming (docs/streaming.md)")
    m.add_argument("--moe-stream", action="store_true", help="keep experts on flash, read them when routed")
    m.add_argument(
        "--cache-mb",
        type=cache_mb,
        default=None,
        metavar="N|auto",
        help="expert cache budget in MiB; 0 = cache off; auto (default) = the memory left after the "
        "run's own needs (dense weights, KV, llama.cpp's compute buffer) and a reserve: a margin sized "
        "from the run inside a memory cgroup, a floor sized from the machine outside one (docs/streaming.md)",
    )
    m.add_argument(
        "--expert-store",
        default="auto",
        metavar="auto|off|PATH",
        help="read the experts from a store written once in llama.cpp's repacked layout (python -m "
        "bmoe.store writes one): no repack as they are read, each read straight into the cache. auto "
        "(default): this model's store in bmoe's cache folder where one was written and still checks "
        "out (this model file, this llama.cpp, sampled slices repacked again), else the model file; "
        "off; or a store's path (an error where it does not check out). The same output either way",
    )
    m.add_argument(
        "--cache-ceil-mb",
        type=int,
        default=None,
        metavar="N",
        help="upper bound for --cache-mb auto and for the governor's growth",
    )
    m.add_argument(
        "--cache-policy",
        choices=EVICTIONS,
        default=DEFAULT_EVICTION,
        help=f"what the expert cache evicts first: slru (the segmented LRU's least recent), lfu (the "
        f"fewest recent uses, halved every --cache-half-life decode tokens), lru (the least recent, "
        f"no protected segment) or adaptive (whichever of the three hit most on the last decode "
        f"tokens, judged by ghost caches beside the cache); lossless either way "
        f"(default {DEFAULT_EVICTION}; docs/streaming.md)",
    )
    m.add_argument(
        "--cache-victims",
        choices=VICTIMS_SETTINGS,
        default=DEFAULT_VICTIMS,
        help=f"whose experts a miss evicts: global (the --cache-policy's choice over every layer) or layer "
        f"(the missing layer's own first, where its share of the cache holds two tokens' experts: each miss "
        f"is read into the memory its victim held, no page moved) or auto (whichever costs this machine "
        f"less, weighed as the run goes from the reads and page moves it measures); lossless either way "
        f"(default {DEFAULT_VICTIMS}; docs/streaming.md)",
    )
    m.add_argument(
        "--cache-half-life",
        type=int,
        default=DEFAULT_HALF_LIFE,
        metavar="N",
        help=f"with --cache-policy lfu or adaptive: the decode tokens after which a use counts half "
        f"(default {DEFAULT_HALF_LIFE})",
    )
    m.add_argument(
        "--cache-governor",
        choices=GOVERNOR_MODES,
        default="auto",
        help="shrink the cache when memory runs short (PSI, the cgroup's limit, MemAvailable) and grow it "
        "back when memory is free: auto (default) = on under --cache-mb auto; on; off",
    )
    m.add_argument(
        "--profile",
        default="auto",
        metavar="FILE|auto|off",
        help="the usage profile: warm the cache at start with the experts earlier runs routed most, read "
        "in the background, and learn into it (auto, the default: one file per model in profiles/ "
        "under bmoe's cache root, ~/.cache/bmoe unless $BMOE_CACHE_DIR or $XDG_CACHE_HOME moves it, "
        "or in $BMOE_PROFILE_DIR: docs/files.md; off; or a file)",
    )
    m.add_argument(
        "--profile-share",
        type=float,
        default=WARM_SHARE,
        metavar="F",
        help=f"warm at most this share of the cache from the profile (default: {WARM_SHARE})",
    )
    m.add_argument("--io-threads", type=int, default=4, metavar="N", help="read lanes (default: 4)")
    m.add_argument("--no-odirect", action="store_true", help="buffered reads instead of O_DIRECT")
    m.add_argument(
        "--stream-policy",
        choices=STREAM_POLICIES,
        default="fast",
        help="fast (default: the C engine) or reference (the Python policies, the routing ones included, "
        "through the expert-source port; slow, identical output, for checking the fast path; no traces)",
    )
    m.add_argument(
        "--prefetch",
        type=int,
        default=0,
        metavar="K",
        help="in decode, read ahead the next K MoE layers' experts as the previous token routed them, "
        "while llama.cpp computes (lossless; needs the cache; default: 0 = off)",
    )
    m.add_argument(
        "--predict-prefetch",
        nargs="?",
        const="on",
        default=None,
        choices=("on", "auto"),
        metavar="auto",
        help="in decode, apply the next MoE layer's router to this layer's router input (the stale gate) "
        "and read its predicted misses ahead (lossless; needs the cache; excludes --prefetch); auto: "
        "only while at most 10%% of the last 64 layer calls' experts were not cached (latency-bound)",
    )
    m.add_argument(
        "--predict-spec-max",
        type=int,
        default=2,
        metavar="N",
        help="with --predict-prefetch: predicted misses read ahead per layer (default: 2)",
    )
    m.add_argument(
        "--predict-depth",
        type=int,
        default=1,
        metavar="N",
        help="with --predict-prefetch: guess each of the next N MoE layers, nearest first: reads start "
        "earlier, guessed less well (1-4; default: 1)",
    )
    m.add_argument(
        "--predict-log",
        action="store_true",
        help="evaluate the stale-gate prediction without reading anything: its agreement per layer "
        "(the moe-predict: line)",
    )
    m.add_argument(
        "--route-ahead",
        type=int,
        default=0,
        metavar="N",
        help="LOSSY: in decode, replace each layer's expert selection with the ranking its router gave "
        "the input N MoE layers earlier, and read those experts that early (default: 0 = off; "
        "excludes --prefetch, --predict-prefetch and --predict-log)",
    )
    m.add_argument(
        "--drop-cold-experts",
        type=float,
        default=0.0,
        metavar="F",
        help="LOSSY: in decode, do not read a selected expert that is not cached and whose weight is "
        "below F / top-k; its weight becomes 0 (never the top expert; needs the cache; default: 0 = off)",
    )
    m.add_argument(
        "--expert-substitute",
        type=float,
        default=None,
        metavar="L",
        help="LOSSY: in decode, serve a selected expert that is not cached with a cached one whose "
        "router score is within L of it (never the top expert; needs the cache; default: off)",
    )
    m.add_argument(
        "--route-trace",
        metavar="FILE",
        default=None,
        help="write every routed slot as CSV (turn, phase, step, layer, slot, expert, weight, residency, "
        "expert_bytes, dropped; docs/telemetry.md)",
    )
    m.add_argument(
        "--io-trace",
        metavar="FILE",
        default=None,
        help="write every expert read as CSV (turn, phase, step, layer, expert, proj, lane, spec, offset, "
        "req_bytes, read_bytes, latency_ns; docs/telemetry.md)",
    )
    m.add_argument(
        "--no-prefill-ahead",
        action="store_true",
        help="in a prefill batch that routes most of a layer's experts, do not read the whole next "
        "layer ahead (default: read it ahead, behind the compute)",
    )


def add_decide_options(group: argparse._ArgumentGroup, decide_help: str) -> None:
    """``--decide`` and the kept prefix state's settings."""
    group.add_argument("--decide", action="store_true", help=decide_help)
    group.add_argument(
        "--decide-prefix-cache",
        choices=PREFIX_CACHE_MODES,
        default="auto",
        help="keep the state after a decision's prefix: auto (default), on, off",
    )
    group.add_argument(
        "--decide-prefix-slots",
        type=int,
        default=1,
        metavar="K",
        help="keep the prefix states of the K most recent prefixes (default: 1)",
    )
    group.add_argument(
        "--decide-probe",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --decide: append one JSON line per decision to FILE: the choices read after each "
        "layer (a logit lens), the routing of the prefill (docs/telemetry.md; experimental)",
    )


def add_run_options(p: argparse.ArgumentParser, *, server: bool) -> None:
    """``--no-think``, the sampling flags and ``--verbose``: a run's settings for the CLI, the
    defaults of requests that leave them unsaid for the server (``server``)."""
    default = "default " if server else ""
    p.add_argument(
        "--no-think",
        action="store_true",
        help="render chat turns with thinking off by default"
        if server
        else "with --chatml: render with thinking off",
    )
    p.add_argument("--seed", type=int, default=0, help=f"{default}sampling seed (default: 0)")
    p.add_argument("--temp", type=float, default=0.0, help=f"{default}temperature; 0 = greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=40, help=f"{default}top-k when temperature > 0 (default: 40)")
    p.add_argument(
        "--top-p", type=float, default=0.95, help=f"{default}top-p when temperature > 0 (default: 0.95)"
    )
    p.add_argument("--verbose", action="store_true", help="show llama.cpp's log on stderr")
