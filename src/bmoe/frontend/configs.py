"""The shared flags (``bmoe.frontend.flags``) read into settings: the model they name, the
context, placement, streaming and decision settings, the sampling, and ``session_config``,
the one place a ``SessionConfig`` is built from parsed flags. ``python -m bmoe.cli`` and
``python -m bmoe.serve`` both call it and add only what is theirs (the CLI: ``--chatml``,
``-n``; the server: chat always, ``-np``); a test holds them to the same config for every
flag they share."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bmoe.adapters.cpu_topology import physical_cores
from bmoe.adapters.llama import ContextParams
from bmoe.domain.decide import DecideConfig
from bmoe.domain.placement import Placement, parse_device_names, parse_rpc_servers
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamConfig, prompt_batch
from bmoe.errors import ConfigError
from bmoe.frontend.vision_options import vision_fields
from bmoe.runtime import SessionConfig

DEFAULT_MODEL_FIXTURE = "qwen3moe"


def chosen_model(args: argparse.Namespace) -> Path | None:
    """The model ``-m`` or ``-hf`` names (``-hf`` fetched when missing); ``None``: neither."""
    if args.hf_repo is not None and args.model is not None:
        raise ConfigError("give -m or -hf, not both")
    if args.hf_file is not None and args.hf_repo is None:
        raise ConfigError("--hf-file needs -hf USER/REPO")
    if args.hf_repo is not None:
        from bmoe.adapters.hf_hub import fetch_model

        return fetch_model(args.hf_repo, args.hf_file)
    return Path(args.model) if args.model is not None else None


def resolve_model(args: argparse.Namespace, prog: str) -> Path:
    """The model ``-m`` or ``-hf`` names, else the built-in tiny model (generated on first
    use), said on stderr with ``prog`` (the command's name) in front."""
    path = chosen_model(args)
    if path is not None:
        return path
    from bmoe.tinymodel import default_model_path

    path = default_model_path()
    print(
        f"{prog}: no -m given, using the built-in tiny model ({DEFAULT_MODEL_FIXTURE}, random weights): "
        f"{path}",
        file=sys.stderr,
    )
    return path


def chosen_mmproj(args: argparse.Namespace) -> Path | None:
    """The vision encoder: ``--mmproj``, else with ``-hf`` the repository's own (fetched;
    ``--no-mmproj``: none), else none."""
    given: Path | None = getattr(args, "mmproj", None)
    if given is not None:
        return given
    if getattr(args, "hf_repo", None) is None or getattr(args, "no_mmproj", True):
        return None
    from bmoe.adapters.hf_hub import fetch_mmproj

    return fetch_mmproj(args.hf_repo)


def chat_template_text(args: argparse.Namespace) -> str | None:
    """The ``--chat-template-file``'s text (``ConfigError`` when it cannot be read)."""
    path: Path | None = args.chat_template_file
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--chat-template-file {path}: {exc}") from exc


def placement_config(args: argparse.Namespace) -> Placement:
    return Placement(
        n_gpu_layers=args.n_gpu_layers,
        devices=parse_device_names(args.device),
        rpc=parse_rpc_servers(args.rpc) if args.rpc else (),
        n_cpu_moe=args.n_cpu_moe,
        cpu_moe=args.cpu_moe,
    )


def stream_config(args: argparse.Namespace) -> StreamConfig:
    return StreamConfig(
        enabled=args.moe_stream,
        size_prompt_batch=args.moe_stream and args.batch_size is None,  # -b unsaid: sized from the room
        cache_mb=args.cache_mb,
        cache_ceil_mb=args.cache_ceil_mb,
        governor=args.cache_governor,
        profile=args.profile,
        profile_share=args.profile_share,
        io_threads=args.io_threads,
        odirect=not args.no_odirect,
        policy=args.stream_policy,
        eviction=args.cache_policy,
        victims=args.cache_victims,
        half_life=args.cache_half_life,
        prefetch=args.prefetch,
        prefill_ahead=not args.no_prefill_ahead,
        predict_prefetch=args.predict_prefetch is not None,
        predict_auto=args.predict_prefetch == "auto",
        predict_spec_max=args.predict_spec_max,
        predict_depth=args.predict_depth,
        predict_log=args.predict_log,
        route_ahead=args.route_ahead,
        drop_cold=args.drop_cold_experts,
        substitute=args.expert_substitute,
        route_trace=args.route_trace,
        io_trace=args.io_trace,
        expert_store=args.expert_store,
    )


def decide_config(args: argparse.Namespace) -> DecideConfig:
    return DecideConfig(
        enabled=args.decide,
        prefix_cache=args.decide_prefix_cache,
        prefix_slots=args.decide_prefix_slots,
        probe=args.decide_probe,
    )


def context_params(args: argparse.Namespace) -> ContextParams:
    """``-c``, ``-b`` (streaming's default prompt batch when unsaid) and ``-t``."""
    batch = prompt_batch(args.batch_size, streaming=args.moe_stream, n_ctx=args.ctx_size)
    threads = args.threads if args.threads is not None else physical_cores()
    return ContextParams(
        n_ctx=args.ctx_size,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=threads,
        flash_attn=args.flash_attn,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
    )


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """``--temp``, ``--top-k``, ``--top-p``, ``--seed``."""
    return SamplingParams(temp=args.temp, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def session_config(args: argparse.Namespace, model: Path) -> SessionConfig:
    """The session every shared flag describes, on ``model``: the one mapping of flags to a
    ``SessionConfig`` (``ConfigError``: a template file unread, a placement or a setting
    refused). The commands add their own fields with ``attrs.evolve``."""
    return SessionConfig(
        model_path=model,
        context=context_params(args),
        think=not args.no_think,
        verbose=args.verbose,
        n_expert_used=args.n_expert_used,
        repack=not args.no_repack,
        amx=args.amx,
        decide=decide_config(args),
        stream=stream_config(args),
        placement=placement_config(args),
        chat_template=chat_template_text(args),
        cache_ram_mb=args.cache_ram,
        cache_disk=args.cache_disk,
        cache_disk_mb=args.cache_disk_mb,
        slot_similarity=args.slot_prompt_similarity,
        draft=args.draft,
        **vision_fields(args, chosen_mmproj(args)),
    )
