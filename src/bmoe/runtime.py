"""Wiring: open a model with the llama.cpp adapters and run the generation use case.

This is the one place where concrete adapters meet the service layer (a composition root,
as in cosmicpython's ``bootstrap``). ``run()`` is the one-shot path the CLI uses.
"""

from __future__ import annotations

import time
from pathlib import Path

import attrs

from bmoe.adapters.llama import ContextParams, LlamaContext, LlamaModel, Sampler
from bmoe.adapters.llama.generate_backend import LlamaGenerateBackend
from bmoe.adapters.llama.log import set_llama_verbose
from bmoe.domain.generation import GenerationRequest, GenerationResult
from bmoe.service.generate import OnText, generate


@attrs.frozen
class RunConfig:
    """Everything fixed when a model is opened."""

    model_path: Path
    context: ContextParams = attrs.field(factory=ContextParams)
    verbose: bool = False


@attrs.frozen
class RunOutcome:
    """A generation plus facts about the model it ran on."""

    result: GenerationResult
    load_s: float
    arch: str
    n_expert: int
    n_expert_used: int


def run(config: RunConfig, request: GenerationRequest, on_text: OnText | None = None) -> RunOutcome:
    """Open the model, generate once, close everything (also on error)."""
    set_llama_verbose(config.verbose)
    t0 = time.perf_counter()
    with LlamaModel(config.model_path) as model, LlamaContext(model, config.context) as ctx:
        load_s = time.perf_counter() - t0
        with Sampler(request.sampling) as sampler:
            result = generate(LlamaGenerateBackend(model, ctx, sampler), request, on_text)
        return RunOutcome(
            result=result,
            load_s=load_s,
            arch=model.arch,
            n_expert=model.n_expert,
            n_expert_used=model.n_expert_used,
        )
