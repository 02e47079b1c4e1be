"""Tiny deterministic MoE GGUF models that bmoe generates itself (never downloaded).

The built-in default model (:mod:`bmoe.tinymodel.default`, what ``python -m bmoe.cli``
runs without ``-m``) and the machinery that writes it, which the test fixtures of
:mod:`bmoe.testing.fixtures` share:

- :mod:`~bmoe.tinymodel.spec`: what a tiny model is (:class:`FixtureSpec`, its shapes);
- :mod:`~bmoe.tinymodel.archs`: per-architecture keys and tensors (``qwen3moe``, shared parts);
- :mod:`~bmoe.tinymodel.weights`: deterministic random weights, one stream per tensor;
- :mod:`~bmoe.tinymodel.tokenizer` (with :mod:`~bmoe.tinymodel.corpus`): the byte-level BPE tokenizer;
- :mod:`~bmoe.tinymodel.template`: the ChatML chat template;
- :mod:`~bmoe.tinymodel.writer`: a spec to GGUF file(s);
- :mod:`~bmoe.tinymodel.cache`: build once per machine, under ``fixtures/`` of bmoe's cache
  root (:mod:`bmoe.adapters.cache_dirs`; ``$BMOE_FIXTURE_DIR`` moves it).
"""

from __future__ import annotations

from bmoe.tinymodel.default import DEFAULT_SPEC, default_model_path

__all__ = ["DEFAULT_SPEC", "default_model_path"]
