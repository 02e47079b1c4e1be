"""A resident model's weights placed by bmoe, where llama.cpp's own placement is refused.

Stock llama.cpp places each weight at load in the first of its CPU extra buffer types that
computes it (``use_extra_bufts``: ``AMX``, then ``CPU_REPACK``). Where AMX is refused
(``bmoe.domain.cpu_features``: its tiles fault here, or ``--amx off``) the model is loaded
without extra buffer types and placed here, the way streaming places its dense part:

1. one decode of token 0 in a throwaway context, the streamer in capture mode: every
   weight the graph reads and the op it feeds (``streaming_capture.capture``);
2. each weight in host memory moved into the first extra buffer type, refused ones left
   out, whose kernels compute its op (``CpuRepack.place``: the test llama.cpp's loader
   makes), dense and routed experts alike; llama.cpp allocates and fills the buffers
   (``DenseRepack``), and the pages the weights leave are given back.

The capture computes with the file's layout (no extra buffer type yet), which every CPU
runs. The gates check the result against stock llama.cpp's own placement where the two
must agree (a CPU without AMX), bit for bit.
"""

from __future__ import annotations

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel
from bmoe.adapters.llama.devices import backend_api
from bmoe.adapters.llama.repack import CpuRepack, DenseRepack
from bmoe.adapters.native_errors import native_call
from bmoe.adapters.streaming_capture import capture
from bmoe.cext import expert_stream
from bmoe.domain.weight_layout import WeightLayout

# the capture decodes one token: the smallest context llama.cpp takes will do
_CAPTURE_PARAMS = ContextParams(n_ctx=8, n_batch=1, n_ubatch=1, n_threads=1)


def place_resident(model: LlamaModel, refuse: tuple[str, ...]) -> WeightLayout:
    """Move the model's weights into llama.cpp's extra buffer types but ``refuse``d ones,
    as its loader would; what was placed, for the ``mode:`` line. The model must be loaded
    without extra buffer types (``ModelParams.use_extra_bufts=False``)."""
    cpu = CpuRepack.find(refuse)
    if cpu is None:
        return WeightLayout(asked=True)
    with native_call("placing the weights: allocating the capture"):
        streamer = expert_stream.ExpertStreamer(
            n_layer=max(1, model.n_layer), n_expert=max(1, model.n_expert), n_proj=1
        )
        api = backend_api()
        streamer.set_backend_api(api["tensor_get"], api["buffer_is_host"], api["nbytes"])
    try:
        with LlamaContext(model, _CAPTURE_PARAMS, eval_callback=streamer) as ctx:
            capture(ctx, streamer, None)
        if streamer.capture_overflow:
            return WeightLayout(asked=True, available=True, resident=True)
        in_host = set(streamer.captured())
        weights = streamer.captured_weights()
    finally:
        streamer.close()
    placed: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    n_used = model.n_expert_used
    for name, (tensor, uses) in weights.items():
        if name not in in_host:
            continue
        where = cpu.place(tensor, uses, n_used)
        if where is not None:
            placed.setdefault(where[1], []).append(tensor)
            names[where[1]] = where[0]
    with native_call("placing the weights in llama.cpp's extra buffer types"):
        dense = DenseRepack(placed, moved=expert_stream.give_back, names=names)
    model.keep_until_closed(dense)
    return WeightLayout(
        asked=True,
        available=True,
        resident=True,
        dense_tensors=dense.n_tensors,
        dense_bytes=dense.n_bytes,
        buffers=tuple(dense.by_type.items()),
    )
