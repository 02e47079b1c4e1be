"""The prompt cache's wiring: memory (``--cache-ram``) and, with ``--cache-disk DIR``, the
disk tier below it (:mod:`bmoe.adapters.state_files`), whose folder is named by the model's
content and by what shapes a saved state (llama.cpp's version, the KV cache's types and
layout), so that a state is only ever restored into a context that can take it."""

from __future__ import annotations

import sys
from collections.abc import Callable

import llama_cpp

from bmoe.adapters.gguf_layout import shard_paths
from bmoe.adapters.state_files import StateFiles, state_identity
from bmoe.adapters.usage_profile_file import model_key
from bmoe.domain.prompt_cache import MIB, PromptCache, cache_ram_bytes
from bmoe.errors import FileNotKeptError
from bmoe.runtime.session_config import SessionConfig


def open_prompt_cache(config: SessionConfig, notes: list[str]) -> PromptCache | None:
    """The session's prompt cache, or None where neither tier is on. A line for every state
    file the disk tier refuses, and for its disk failing, goes to ``notes`` and to stderr
    when it happens. A ``--cache-disk`` folder that cannot be made or written (read-only,
    full, not ours) is one such line, and the session goes on without the disk tier."""
    if not config.cache_ram_mb and config.cache_disk is None:
        return None
    spill = None
    if config.cache_disk is not None:
        c = config.context
        shape = (
            llama_cpp.__version__,
            c.cache_type_k,
            c.cache_type_v,
            c.flash_attn,
            c.swa_full,
            c.n_seq_max,
        )
        identity = state_identity(model_key(shard_paths(config.model_path)), shape)
        say = _Say(notes)
        try:
            spill = StateFiles(config.cache_disk, identity, config.cache_disk_mb * MIB, say)
        except FileNotKeptError as exc:
            notes.append(f"warning: --cache-disk {config.cache_disk}: {exc}; going on without the disk tier")
            if not config.cache_ram_mb:
                return None
        say.live = True  # from now on a line is printed when it happens (the front ends print notes at start)
    return PromptCache(cache_ram_bytes(config.cache_ram_mb), spill)


class _Say:
    """A line for ``notes``; once ``live``, printed to stderr as well, when it happens."""

    def __init__(self, notes: list[str]) -> None:
        self.notes = notes
        self.live = False

    def __call__(self, line: str) -> None:
        self.notes.append(line)
        if self.live:
            print(line, file=sys.stderr, flush=True)


def keep_at_close(cache: PromptCache | None, keep_context: Callable[[], None]) -> None:
    """Before the context goes: where the prompt cache has a disk tier, the context's state
    joins the cache (``keep_context``) and every state in memory is written to the disk, so
    a restarted session finds them."""
    if cache is None or cache.spill is None:
        return
    keep_context()
    cache.persist()
