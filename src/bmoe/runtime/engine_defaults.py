"""A session's ``EngineDefaults`` from its config and model: among them whether it drafts
(``SessionConfig.draft``). Copy drafts cut rejected tokens from the KV, which a recurrent
memory or a pruned sliding window cannot do; there ``--draft copy`` is off, with one line
saying why. The policy learns the model's experts (the price of a verify batch). A verify
decodes the current token and its draft in one ubatch: a draft is at most ``n_ubatch - 1``
tokens (a longer one would be split in two ubatches, the second reading again the experts
its rows route to)."""

from __future__ import annotations

import attrs

from bmoe.adapters.llama import LlamaModel
from bmoe.domain.drafting import DraftPolicy
from bmoe.runtime.session_config import SessionConfig
from bmoe.service.session_engine import EngineDefaults


def draft_policy(config: SessionConfig, model: LlamaModel, notes: list[str]) -> DraftPolicy | None:
    """The drafting policy of ``config`` (its context's batch as chosen) on ``model`` (None:
    off; a note where refused)."""
    if config.draft != "copy":
        return None
    if model.is_recurrent_or_hybrid or model.n_swa > 0:
        notes.append("draft: copy drafts need a memory that can drop a rejected draft: off for this model")
        return None
    policy = attrs.evolve(config.draft_policy, experts=(model.n_expert, model.n_expert_used))
    most = max(1, min(config.context.n_batch, config.context.n_ubatch) - 1)
    if policy.max_draft > most:
        policy = attrs.evolve(policy, max_draft=most, min_draft=min(policy.min_draft, most))
    return policy


def engine_defaults(config: SessionConfig, model: LlamaModel, notes: list[str]) -> EngineDefaults:
    draft = draft_policy(config, model, notes)
    return EngineDefaults(chat=config.chat, think=config.think, n_predict=config.n_predict, draft=draft)
