"""Which configurations cannot run under ``--mem-limit-mb``, decided before anything runs.

``stock`` loads as llama.cpp does by default: with weight repacking on, every weight a
repacked kernel can use is copied at load into a ``CPU_REPACK`` buffer, anonymous memory
that cannot be paged back to the file. On a MoE model that is nearly all of its bytes
(the experts), so the load needs about the model file's size in RAM. In a memory group
smaller than that the copy cannot be held: the load swaps or thrashes for many minutes with
no line of progress, then is OOM-killed or times out. The bench says so up front and skips
it instead. ``stock-norepack`` maps the file and leaves the weights in the page cache, which
the kernel can evict and fetch again: it thrashes, it still runs, so it is the stock figure
under a limit.

The model file's size stands for the repacked bytes (which weights repack depends on their
types and the CPU's kernels; the file's size bounds them). A model whose weights mostly do
not repack on this CPU is then skipped though it might load, but its ``stock`` run would be
``stock-norepack``'s, which still runs; and a load whose copy is near the limit fails anyway
(the copy is read through the page cache, charged to the same group). Pure: sizes in,
reasons out.
"""

from __future__ import annotations

from collections.abc import Sequence

from bmoe.bench.configs import BenchConfig

MIB = 1024 * 1024
GIB = 1024 * MIB

REPACKING_KINDS = ("stock",)
"""The configurations that always load with llama.cpp's weight repacking into anonymous
memory; bmoe ``resident`` does too unless the bench runs with ``--no-repack`` (bmoe
``stream`` repacks only what it reads, within its cache)."""


def _size(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB" if n_bytes >= GIB else f"{n_bytes / MIB:.1f} MiB"


def repack_skip_reason(
    model_bytes: int,
    mem_limit_mb: int,
    *,
    who: str = "llama.cpp's default load",
    instead: str = "run stock-norepack",
) -> str | None:
    """Why a repacking load cannot fit ``mem_limit_mb`` (0: no limit), None when it may."""
    if mem_limit_mb <= 0 or model_bytes <= mem_limit_mb * MIB:
        return None
    return (
        f"{who} repacks the weights into {_size(model_bytes)} of anonymous "
        f"memory, more than the {mem_limit_mb} MiB limit ({instead}, or raise --mem-limit-mb)"
    )


def skipped_configs(
    configs: Sequence[BenchConfig], model_bytes: int, mem_limit_mb: int, *, bmoe_repack: bool = True
) -> dict[str, str]:
    """``{key: reason}`` of the configurations to skip under the limit, in run order."""
    reasons = {kind: repack_skip_reason(model_bytes, mem_limit_mb) for kind in REPACKING_KINDS}
    if bmoe_repack:
        reasons["resident"] = repack_skip_reason(
            model_bytes,
            mem_limit_mb,
            who="bmoe resident, as llama.cpp's default load,",
            instead="run the bench with --no-repack",
        )
    return {c.key: reason for c in configs if (reason := reasons.get(c.kind)) is not None}


UNCONFINED_NOTE = (
    "runs outside the memory limit (it cannot load in it): its step is the compute a streamed "
    "step is held to (its bound), not a figure under the limit"
)


def outside_the_limit(configs: Sequence[BenchConfig], skipped: dict[str, str]) -> dict[str, str]:
    """The skipped configurations that run outside the memory group instead, ``{key: why}``:
    ``resident``, where a streamed configuration runs in the group and needs its step for the
    bound ("Where a streamed step goes"); the disk throttle still holds it."""
    streams = any(c.streams and c.key not in skipped for c in configs)
    return {c.key: UNCONFINED_NOTE for c in configs if c.key in skipped and c.kind == "resident" and streams}
