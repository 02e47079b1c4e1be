"""Step 4 of ``ExpertStreaming.attach``, the *repack* (unless ``--no-repack``).

The weights llama.cpp would repack at load are repacked as it does
(``bmoe.adapters.llama.repack``): the dense ones moved into a ``CPU_REPACK`` buffer (their
overlay pages given back), the routed experts' tensors tagged so that the lanes write each
expert repacked as they read it (docs/streaming.md, "Repacked weights").
"""

from __future__ import annotations

from bmoe.adapters.gguf_layout import TensorLocation
from bmoe.adapters.llama.model import LlamaModel
from bmoe.adapters.llama.repack import CpuRepack, DenseRepack, ExpertRepack
from bmoe.adapters.native_errors import native_call
from bmoe.cext import expert_stream
from bmoe.domain.streaming.engine_options import RepackParts
from bmoe.domain.weight_layout import WeightLayout


def repack_weights(
    model: LlamaModel,
    streamer: expert_stream.ExpertStreamer,
    found: list[tuple[int, int, TensorLocation]],
    parts: RepackParts = "all",
    refuse: tuple[str, ...] = (),
) -> WeightLayout:
    """Place what llama.cpp would (after the overlay and the routers' copies: the dense
    bytes are read from the overlay, whose pages are given back once moved): each dense
    weight in the first extra buffer type that computes it (``AMX`` before ``CPU_REPACK``
    unless refused), each routed expert repacked into ``CPU_REPACK`` as it is read."""
    cpu = CpuRepack.find(refuse)
    if cpu is None:
        return WeightLayout(asked=True)
    weights = streamer.captured_weights()
    expert_names = {loc.name for _, _, loc in found}
    n_used = model.n_expert_used
    dense_at: dict[int, list[int]] = {}  # buft -> dense tensors placed there
    names: dict[int, str] = {}
    experts: dict[str, int] = {}
    for name, (t, use) in weights.items():
        is_expert = name in expert_names
        # ``parts``, an A/B switch for benchmarks only (EngineOptions.repack_parts): the dense
        # weights' share of the gain and the experts' (the output then matches no resident run)
        if parts in ("dense", "experts") and is_expert != (parts == "experts"):
            continue
        if is_expert:
            if cpu.wants(t, use, n_used):
                experts[name] = t
        elif (where := cpu.place(t, use, n_used)) is not None:
            dense_at.setdefault(where[1], []).append(t)
            names[where[1]] = where[0]
    with native_call("repacking the dense weights"):
        dense = DenseRepack(dense_at, moved=expert_stream.give_back, names=names)
        model.keep_until_closed(dense)
        expert = ExpertRepack(cpu, experts.values())
        model.keep_until_closed(expert)
    n_repacked = 0
    for layer, p, loc in found:
        template = expert.templates.get(experts.get(loc.name, 0), 0)
        if template:
            streamer.set_projection_repack(layer, p, template, expert.tensor_set)
            n_repacked += 1
    return WeightLayout(
        asked=True,
        available=True,
        dense_tensors=dense.n_tensors,
        dense_bytes=dense.n_bytes,
        expert_tensors=n_repacked,
        expert_tensors_total=len(found),
        buffers=tuple(dense.by_type.items()),
    )
