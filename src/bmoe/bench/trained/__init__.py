"""``python -m bmoe.bench.trained``: a small ``qwen3moe`` trained on this machine's text, for
judging expert-prediction policies on realistic routing (the bench model's routers are random).

Numpy only (no torch needed, tested in CI): :mod:`~bmoe.bench.trained.layout` (shapes, tensor
names, weights as a name-to-array mapping), :mod:`~bmoe.bench.trained.init` (random initial
weights), :mod:`~bmoe.bench.trained.export` (GGUF), :mod:`~bmoe.bench.trained.reference` (a
numpy forward pass of llama.cpp's ``qwen3moe`` graph), :mod:`~bmoe.bench.trained.check`
(llama.cpp's logits against a reference), :mod:`~bmoe.bench.trained.figures` (routing figures
from arrays), :mod:`~bmoe.bench.trained.table`, :mod:`~bmoe.bench.trained.corpus` and
:mod:`~bmoe.bench.trained.tokens` (the text and its ids).

torch (the ``train`` extra, imported through :mod:`~bmoe.bench.trained.torchlib`):
:mod:`~bmoe.bench.trained.torch_model`, :mod:`~bmoe.bench.trained.train`,
:mod:`~bmoe.bench.trained.held_out`. :mod:`~bmoe.bench.trained.main` is the command.
"""
