"""What streaming costs here beyond its reads, measured with bmoe's own streamer: the plan's
CPU per MiB read.

The compute calibration's small generated MoE (``bmoe.runtime.compute_calibration``) is run
twice with the same prompts and decode steps: resident, and streamed with its cache off
(``--cache-mb 0``: every step reads every expert it routes to). The streamed run's time,
less the time it waited for reads (the disk's share, which the plan counts from the disk's
own speed) and less the resident run's, is what streaming added: the read lanes' CPU (the
kernel's ``O_DIRECT`` path, the repack of each expert as it lands, page faults on fresh
slices) taken from the compute threads' cores, and the cache's bookkeeping. Divided by the
MiB read, it is the plan's cost of a MiB read (``bmoe.domain.plan.decode_range``): for a
decode step, and for a prompt (whose batches also compute each expert on fewer tokens).

About two seconds more, once a process per quantization and thread count; ``None`` where
the streamer cannot run here.
"""

from __future__ import annotations

import functools

from bmoe.domain.plan.figures import StreamCosts
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import BmoeError
from bmoe.runtime.compute_calibration import (
    PREFILL_TOKENS,
    Sample,
    calibration_quant,
    time_calibration,
)


def measure_stream_costs(bytes_per_weight: float, threads: int) -> StreamCosts | None:
    """The costs (module docstring) with the calibration model nearest the plan's
    quantization; None where they could not be measured."""
    return _measured(calibration_quant(bytes_per_weight), threads)


def _added_per_mib(streamed: Sample, resident: Sample) -> float:
    """Seconds a MiB read added to ``streamed`` beyond its wait for reads (never below 0)."""
    if streamed.read_mib <= 0:
        return 0.0
    return max(0.0, streamed.seconds - streamed.stall_s - resident.seconds) / streamed.read_mib


@functools.cache
def _measured(quant: str, threads: int) -> StreamCosts | None:
    try:
        resident = time_calibration(quant, threads, (PREFILL_TOKENS,))
        streamed = time_calibration(
            quant, threads, (PREFILL_TOKENS,), StreamConfig(enabled=True, cache_mb=0, governor="off")
        )
    except (BmoeError, OSError):
        return None
    return StreamCosts(
        decode_s_per_mib=_added_per_mib(streamed.step, resident.step),
        prefill_s_per_mib=_added_per_mib(streamed.prompts[PREFILL_TOKENS], resident.prompts[PREFILL_TOKENS]),
        source=f"bmoe's streamer timed here, cache off ({quant.upper()}, {threads} threads)",
    )
