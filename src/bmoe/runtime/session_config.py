"""``SessionConfig``: everything fixed when a session opens (spec/session.md); ``OnLoad``:
who follows the opening."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs

from bmoe.adapters.llama import ContextParams
from bmoe.adapters.state_files import DEFAULT_CACHE_DISK_MIB
from bmoe.domain.cpu_features import AmxMode, check_amx_mode
from bmoe.domain.decide import DecideConfig
from bmoe.domain.drafting import DraftPolicy
from bmoe.domain.media.image_keep import DEFAULT_IMAGE_CACHE_MIB
from bmoe.domain.placement import Placement, check_placement
from bmoe.domain.slots import DEFAULT_SIMILARITY
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ConfigError

OnLoad = Callable[[str, float], None]  # (phase, fraction done)


@attrs.frozen
class SessionConfig:
    """Everything fixed when a session opens.

    - ``context``: context length, batch sizes, threads (fixed for the session's life);
    - ``chat``: prompts are user messages rendered through the model's chat template, and
      ``clear_kv=False`` continues the engine-held conversation; otherwise prompts are raw
      text and ``clear_kv=False`` continues the text;
    - ``think`` / ``n_predict``: defaults for requests that leave them unsaid;
    - ``stream``: expert streaming (off by default: the model is resident);
    - ``decide``: decisions (off by default: a session without them allocates nothing for
      them and refuses them);
    - ``n_expert_used``: run a MoE model with this many experts per token instead of its
      own top-k (lossy; ``ConfigError`` outside ``1..n_expert`` or for a dense model).
    - ``repack``: compute with weights in llama.cpp's repacked layout (``CPU_REPACK``), as
      stock llama.cpp does by default: resident, llama.cpp repacks at load; streamed, bmoe
      repacks the same weights (each expert as it is read). False (``--no-repack``): the
      file's layout everywhere. Either way streamed output equals resident output.
    - ``placement``: the dense part of some layers on a GPU or llama.cpp RPC servers
      (``-ngl``, ``--device``, ``--rpc``, ``--n-cpu-moe``; docs/devices.md); experts kept on
      the host are streamed as without it.
    - ``chat_template``: a Jinja chat template to use in place of the model's
      (``--chat-template-file``); ``None``: the model's own.
    - ``amx``: llama.cpp's AMX buffer type (``--amx``): ``auto`` where a probe ran its tile
      instructions on this machine, ``on`` wherever llama.cpp offers it, ``off`` never
      (``bmoe.domain.cpu_features``; docs/machines.md).
    - ``cache_ram_mb``: the prompt cache (``--cache-ram``, llama.cpp's flag): at most this
      many MiB of conversations' states kept in host memory when another conversation takes
      the context, restored when theirs comes back (``bmoe.domain.prompt_cache``); 0 off
      (the library's default), -1 no limit.
    - ``cache_disk`` / ``cache_disk_mb``: the prompt cache's disk tier (``--cache-disk DIR``,
      ``--cache-disk-mb``): states pushed out of memory (all of them with ``cache_ram_mb``
      0) are kept as files in ``DIR`` within this many MiB, and those in memory are written
      there at close, so a conversation that comes back, even to a restarted session, still
      costs only its new tokens (``bmoe.adapters.state_files``: checked whole before use; a
      corrupt or foreign file is refused with a warning and removed). None: no disk tier.
    - ``slot_similarity``: with parallel sequences (``run_parallel``), a slot keeps its KV
      after its request and a new request takes the free slot sharing the longest prefix
      with its prompt when that prefix is at least this share of the prompt
      (``--slot-prompt-similarity``, llama.cpp's; ``bmoe.domain.slots``).
    - ``draft``: ``copy`` verifies drafts copied from the request's own context in one
      batch (``--draft``; greedy requests, one sequence; ``bmoe.service.copy_drafts``),
      ``off`` (the default) never; ``draft_policy`` its match and draft lengths.
    - ``mmproj``: the model's vision encoder (``--mmproj``, llama.cpp's flag): requests may
      then carry images (``GenerateRequest.images``), encoded by it (resident) and decoded
      by the language model (streamed or not, as the rest); ``image_min_tokens`` /
      ``image_max_tokens`` bound an image's tokens for encoders of dynamic resolution
      (-1: the file's own). None: text only, an image is refused by name.
      ``image_cache_mb``: the most the encoder keeps of the images it has seen (their
      embeddings and pictures, ``--image-cache-mb``), so that a conversation's earlier
      images are not encoded again; a streamed run sets that much memory aside.
    """

    model_path: Path
    context: ContextParams = attrs.field(factory=ContextParams)
    chat: bool = False
    think: bool = True
    n_predict: int = 128
    verbose: bool = False
    stream: StreamConfig = attrs.field(factory=StreamConfig)
    decide: DecideConfig = attrs.field(factory=DecideConfig)
    n_expert_used: int | None = None
    repack: bool = True
    placement: Placement = attrs.field(factory=Placement)
    chat_template: str | None = None
    amx: AmxMode = "auto"
    cache_ram_mb: int = 0
    slot_similarity: float = DEFAULT_SIMILARITY
    cache_disk: Path | None = None
    cache_disk_mb: int = DEFAULT_CACHE_DISK_MIB
    draft: Literal["copy", "off"] = "off"
    draft_policy: DraftPolicy = attrs.field(factory=DraftPolicy)
    mmproj: Path | None = None
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    image_cache_mb: int = DEFAULT_IMAGE_CACHE_MIB

    @classmethod
    def from_hf(cls, spec: str, hf_file: str | None = None, **fields: Any) -> SessionConfig:
        """A config for the Hub model ``spec`` names (``USER/REPO[:QUANT]``, llama.cpp's
        ``-hf``; ``hf_file`` names the file outright), fetched into the Hugging Face cache
        when it is not there yet (needs ``bmoe[hf]``; ``ModelFetchError`` when it cannot)."""
        from bmoe.adapters.hf_hub import fetch_model

        return cls(model_path=fetch_model(spec, hf_file), **fields)

    def __attrs_post_init__(self) -> None:
        check_amx_mode(self.amx)
        if self.draft not in ("copy", "off"):
            raise ConfigError(f"--draft must be copy or off, not {self.draft!r}")
        if self.n_predict < 0:
            raise ConfigError(f"n_predict must be >= 0, not {self.n_predict}")
        check_placement(self.placement, self.stream, self.decide)
        if not 0.0 <= self.slot_similarity <= 1.0:
            raise ConfigError(f"slot_similarity must be in [0, 1], not {self.slot_similarity}")
        if self.cache_ram_mb < -1:
            raise ConfigError(f"cache_ram_mb takes MiB, 0 (off) or -1 (no limit), not {self.cache_ram_mb}")
        if self.cache_disk_mb < 0:
            raise ConfigError(f"cache_disk_mb takes MiB (>= 0), not {self.cache_disk_mb}")
        if self.image_cache_mb < 0:
            raise ConfigError(f"image_cache_mb takes MiB (>= 0), not {self.image_cache_mb}")
