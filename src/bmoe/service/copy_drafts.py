"""Copy drafts in a request's decode loop (``--draft copy``): the tokens the drafter proposes
are decoded with the current token in one batch, the longest prefix the model itself chooses
is kept and the rest cut from the KV, as llama.cpp's speculative loop does.

Greedy requests only, without penalties, biases, a constraint or log-probabilities: there
the model's choice after a row is that row's argmax, exactly what the greedy sampler picks
(the first of equal maxima), so a verify emits what plain steps would emit from the same
logits. A batch's logits are not bit for bit a one-token step's (llama.cpp computes other
batch sizes with other kernels), so greedy tokens may differ from drafting off at a
near-tie; streamed equals resident with drafting on, the batches being the same.

``Drafting`` keeps one request's state: the drafter (``domain.drafting``), the gate that
stops drafting where it does not pay, and the tokens a verify decided that are still to be
emitted (``pending``: the accepted draft tokens, already in the KV, then the model's next
token, not yet fed).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

import attrs

from bmoe.domain.drafting import CopyDrafter, DraftPolicy, DraftReport, accepted_prefix
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.media import is_image_row
from bmoe.errors import BmoeError
from bmoe.ports.generate_backend import IGenerateBackend


class DraftCutError(BmoeError):
    """The context's memory refused to drop a rejected draft (not fatal: the request ends)."""


def drafts_for(request: GenerateRequest, constrained: bool) -> bool:
    """Whether ``request`` may be drafted: greedy, no penalties, biases, constraint or
    log-probabilities, and not turned off by the request."""
    s = request.sampling
    plain = s.greedy and not s.penalised and not s.logit_bias
    return plain and not constrained and request.logprobs is None and request.draft


class Drafting:
    """One request's drafting: ``next_token`` at the top of each step, ``emitted`` for each
    token the request keeps, ``feed`` in place of the plain step's feed, ``settle`` at the
    end."""

    def __init__(self, prompt: list[int], policy: DraftPolicy) -> None:
        self.drafter = CopyDrafter(prompt, policy)
        self.gate = policy.gate()
        self.pending: deque[tuple[int, bool]] = deque()  # (token, already in the KV)
        self._fed = False  # the token being emitted is in the KV already

    @property
    def report(self) -> DraftReport:
        return self.gate.report

    def next_token(self, sample: Callable[[], int]) -> int:
        if self.pending:
            token, self._fed = self.pending.popleft()
            return token
        self._fed = False
        return sample()

    def emitted(self, token: int) -> None:
        self.drafter.extend([token])

    def feed(self, backend: IGenerateBackend, token: int, kv_tokens: list[int], limit: int) -> None:
        """Put ``token`` in the KV (unless a verify did): alone, or with a draft of at most
        ``limit`` tokens verified in the same batch; ``kv_tokens`` follows the KV."""
        if self._fed:
            return
        draft = self.drafter.propose(limit)
        if any(is_image_row(t) for t in draft.tokens):  # a copy runs into an image: no draft
            draft = attrs.evolve(
                draft, tokens=tuple(itertools.takewhile(lambda t: not is_image_row(t), draft.tokens))
            )
        if not draft.tokens or not self.gate.allow(draft.match):
            backend.feed([token], len(kv_tokens))
            kv_tokens.append(token)
            return
        pos = len(kv_tokens)
        rows = backend.feed_rows([token, *draft.tokens], pos)
        kv_tokens += [token, *draft.tokens]
        choices = [int(c) for c in rows.argmax(axis=-1)]
        accepted = accepted_prefix(draft.tokens, choices)
        self.cut(backend, kv_tokens, pos + 1 + accepted)
        self.gate.verified(len(draft.tokens), accepted)
        self.drafter.taken(len(draft.tokens), accepted)
        self.pending.extend((t, True) for t in draft.tokens[:accepted])
        self.pending.append((choices[accepted], False))

    @staticmethod
    def cut(backend: IGenerateBackend, kv_tokens: list[int], keep: int) -> None:
        if keep >= len(kv_tokens):
            return
        if not backend.keep_prefix(keep):
            raise DraftCutError("the context's memory cannot drop a rejected draft")
        del kv_tokens[keep:]

    def settle(self, backend: IGenerateBackend, kv_tokens: list[int], want: int) -> None:
        """At the end of the loop: the KV as plain steps leave it (``want`` tokens): a
        verify's tokens not emitted, and an emitted one plain steps would not have fed, cut."""
        self.pending.clear()
        self.cut(backend, kv_tokens, want)
