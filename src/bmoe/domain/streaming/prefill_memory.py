"""A streamed session's prompt batch sized from the memory room, and the expert cache lending
that room to it while a prompt runs.

Streaming reads each expert a ubatch routes to once per ubatch, and a long prompt's ubatch
routes to nearly every expert of every layer: a prompt of P tokens at ``-b 512`` reads the
experts about P / 512 times. With ``-b`` unsaid, a streamed session therefore takes the
largest ubatch the memory room allows, up to its context (``choose_prompt_batch``).

What a ubatch costs in memory is llama.cpp's compute buffer, which grows in proportion to
the ubatch (measured, n_ctx 4096: the 4-layer bench model 92 / 368 / 736 MiB at 512 / 2,048
/ 4,096 tokens with flash attention, 294 / 1,176 / 2,352 without; the trained bench model,
its experts 6,144 wide, 294 / 1,176 / 2,352 either way). So one probe context gives the
bytes per token (``compute_per_token``), and the choice is arithmetic.

The room it may take: a prompt-sized ubatch routes to about every expert of a layer, and
the next layer is read whole while it computes (the prefill's read-ahead, which overlaps
the reads with the compute), so while it runs memory holds the dense part, the KV cache,
the compute buffer and two whole layers' experts, and ``PREFILL_FREE_MIB`` stays free (page
cache, the allocator, Python).
The expert cache's budget is not added to that: while a long prompt runs the cache is
useless (the prompt reads nearly every expert anyway), so it *lends* the compute buffer its
room (``PrefillLending``): before a ubatch of more than ``LEND_FROM_TOKENS`` tokens the
budget drops to what the room leaves beside that ubatch's compute buffer, where it does not
already (never below two layers, the one computing and the one read ahead, nor below one
token cycle), and before the
next decode step the session gives the compute buffer's pages back to the system and the
budget returns. Peak memory is then dense + KV + the larger of the budget and compute
buffer + two layers, never budget + a prompt-sized compute buffer.
"""

from __future__ import annotations

import attrs

from bmoe.domain.streaming.budget import Budget, RunMemory
from bmoe.domain.streaming.config import MIB, STREAMED_PROMPT_BATCH

PREFILL_FREE_MIB = 512  # left free while a prompt runs (the decode: domain.streaming.headroom): measured,
# a prompt-sized prefill of the bench model in 2 GiB held 150-260 MiB of RSS beyond dense + KV + cache
# budget + compute buffer (bounce buffers, pages waiting to go back, the process itself)
PROMPT_BATCH_FLOOR = 64  # the least a prompt batch is made (the resident default)
PROMPT_BATCH_STEP = 64  # a chosen batch is a multiple of this (or the whole context)
LEND_FROM_TOKENS = 64  # ubatches above this lend; a decode step's compute stays in the budget


@attrs.frozen
class PrefillRoom:
    """The figures a prompt batch is chosen from, in bytes.

    ``room_bytes``: the memory room read before the context was made and the dense part
    copied in; ``dense_bytes``: the dense part still to copy; ``kv_bytes``: the KV cache;
    ``layer_bytes``: the largest layer's experts (a prompt-sized ubatch holds two: the one
    it computes, the next read ahead);
    ``compute_per_token``: llama.cpp's compute buffer per ubatch token, from a probe context.
    """

    room_bytes: int
    dense_bytes: int
    kv_bytes: int
    layer_bytes: int
    compute_per_token: float

    def compute_room_bytes(self, layers: int = 2) -> int:
        """What the compute buffer may take while a prompt runs, beside ``layers`` whole
        layers' experts (two: the next read ahead while one computes; one: no read-ahead)."""
        held = self.dense_bytes + self.kv_bytes + layers * self.layer_bytes + PREFILL_FREE_MIB * MIB
        return max(0, self.room_bytes - held)


@attrs.frozen
class PromptBatch:
    """The chosen prompt batch (``tokens``, the ``n_batch`` and ``n_ubatch`` of the context)
    and how it was chosen, for the ``mode:`` line."""

    tokens: int
    room: PrefillRoom
    layers: int = 2  # whole layers' experts held beside it (1: no room to read the next ahead)
    with_flash: int | None = None  # the batch the room would allow with flash attention on (-fa on)
    given: bool = False  # -b given, not sized: the cache lends it its room all the same

    def describe(self) -> str:
        """``prompt batch 1792 (sized from the room: compute buffer 1045 of 1068 MiB at 0.583
        MiB a token, beside dense 14 + KV 32 + two layers' experts 324 + 512 free)``."""
        r = self.room
        if self.given:
            compute = self.tokens * r.compute_per_token / MIB
            return f"prompt batch {self.tokens} (-b; compute buffer {compute:.0f} MiB, lent the cache's room)"
        layers = "two layers' experts" if self.layers == 2 else "one layer's experts"
        compute, room = self.tokens * r.compute_per_token, r.compute_room_bytes(self.layers)
        return (
            f"prompt batch {self.tokens} (sized from the room: compute buffer {compute / MIB:.0f} of "
            f"{room / MIB:.0f} MiB at {r.compute_per_token / MIB:.3f} MiB a token, beside dense "
            f"{r.dense_bytes / MIB:.0f} + KV {r.kv_bytes / MIB:.0f} + {layers} "
            f"{self.layers * r.layer_bytes / MIB:.0f} + {PREFILL_FREE_MIB} free"
            + (f"; -fa on would allow {self.with_flash})" if self.with_flash else ")")
        )


def choose_prompt_batch(n_ctx: int, room: PrefillRoom, *, least: int = 1) -> PromptBatch:
    """The largest prompt batch whose compute buffer fits ``room.compute_room_bytes()``
    (beside two layers): the whole context where it fits, else a multiple of
    ``PROMPT_BATCH_STEP``. Where that is below ``STREAMED_PROMPT_BATCH`` (the batch before
    it was sized), that batch as far as the room beside one layer allows. Never below
    ``PROMPT_BATCH_FLOOR`` (nor ``least``, the sequences a decode step holds), nor above the
    context."""
    floor = min(n_ctx, max(PROMPT_BATCH_FLOOR, least))
    if room.compute_per_token <= 0:
        return PromptBatch(n_ctx, room)
    fits = int(room.compute_room_bytes(2) // room.compute_per_token)
    if fits >= n_ctx:
        return PromptBatch(n_ctx, room)
    if fits >= STREAMED_PROMPT_BATCH:
        return PromptBatch(max(floor, fits - fits % PROMPT_BATCH_STEP), room)
    # not even the batch streaming took before with the next layer's room: that batch where
    # one layer leaves it room (the prefill reads without reading ahead), else less
    bare = int(room.compute_room_bytes(1) // room.compute_per_token)
    tokens = min(n_ctx, STREAMED_PROMPT_BATCH, bare - bare % PROMPT_BATCH_STEP)
    return PromptBatch(max(floor, tokens), room, 1)


def decode_compute_bytes(compute_per_token: float, n_ubatch: int) -> int:
    """The part of a prompt-sized compute buffer a decode step keeps (``--cache-mb auto``
    subtracts it): that of a ``LEND_FROM_TOKENS`` step, at most the whole buffer."""
    return int(compute_per_token * min(n_ubatch, LEND_FROM_TOKENS))


def lending_floor(token_cycle_bytes: int, layer_bytes: int, budget_bytes: int) -> int:
    """The least budget a prompt leaves the cache: two layers (the one computing, the next
    read ahead), at least one token cycle where the budget holds one. A budget below the
    cycle (the room held no more: ``budget.least_auto_bytes``) is lent down to the two
    layers: kept whole, it and the prompt's compute buffer outgrew the room the batch was
    sized in."""
    cycle = token_cycle_bytes if budget_bytes >= token_cycle_bytes else 0
    return max(cycle, 2 * layer_bytes)


def budget_held_to_room(back: int, resident: int, now: RunMemory, floor: int) -> int:
    """An ``auto`` budget held to the room read again (``now``): once the session is set up
    (the repack and the rest of the setup take memory after the room was read), and the one a
    prompt gives back. That is ``back`` (the budget before), or less where memory was taken
    that the room read at start did not show. llama.cpp's CPU backend
    keeps a work buffer sized for its largest graph and never shrinks it; without flash
    attention a prompt-sized ubatch's is the F16 copy of the attention scores (heads x KV
    positions x ubatch x 2 bytes): measured, 175 MiB after a 1,600-token ubatch of the bench
    model, and a 2 GiB run whose auto budget returned whole was killed five decode steps
    later. So the room is read again once the compute buffer's pages went back (``now``, with
    the compute buffer a decode step keeps and the prompt states still to come): the cache may
    hold what it holds (``resident``) plus what that room leaves beside the reserve, never
    below ``floor`` (``Budget.floor_bytes``: one token cycle, or two layers below it)."""
    free = max(0, now.headroom.free_bytes - now.still_to_come_bytes)
    return max(min(back, floor), min(back, resident + free))


def spare_bytes(budget: Budget) -> int | None:
    """What the cache and a prompt's compute buffer may take together: the room read once
    the dense part and the KV cache were in, less ``PREFILL_FREE_MIB`` and the prompt cache's
    memory tier (None where no room was read)."""
    if budget.memory is None:
        return None
    held = PREFILL_FREE_MIB * MIB + budget.memory.prompt_states_bytes
    return max(0, budget.memory.room.room_bytes - held)


@attrs.frozen
class Lend:
    """What to do before one ``llama_decode``: set the budget to ``budget`` (None: leave it),
    and give the compute buffer's pages back first (``release``)."""

    budget: int | None = None
    release: bool = False


@attrs.define
class PrefillLending:
    """The expert cache lending its room to a prompt-sized compute buffer (module docstring).

    ``compute_per_token``: the compute buffer's bytes per ubatch token; ``floor_bytes``: the
    least budget while lent (``lending_floor``); ``spare_bytes``: what the cache and a
    prompt's compute buffer may take together (the room once the dense part and the KV cache
    are in, less ``PREFILL_FREE_MIB``): a budget that leaves the compute buffer that much
    lends nothing, a larger one lends only the difference (None: the whole compute buffer
    is lent). ``before(n_tokens, budget)`` is asked before
    each ``llama_decode`` with its token count and the budget (the one to return to while
    lent); a budget someone sets while a prompt holds the room goes through
    ``set_while_lent``: it is the one the prompt gives back to.
    """

    compute_per_token: float
    floor_bytes: int
    spare_bytes: int | None = None  # what the cache and a prompt's compute buffer may take together
    lent_from: int | None = None  # the budget before the lending, while lent
    lent_to: int | None = None  # ... and the one it lent down to
    lent_times: int = 0  # prompts that borrowed (each gave the compute buffer back after)

    def before(self, n_tokens: int, budget: int) -> Lend:
        if n_tokens > LEND_FROM_TOKENS:
            if self.lent_from is not None:  # a later chunk of the same prompt: already lent
                return Lend()
            compute = int(self.compute_per_token * n_tokens)
            spare = budget if self.spare_bytes is None else self.spare_bytes
            lent = max(min(budget, self.floor_bytes), min(budget, spare - compute))
            self.lent_from, self.lent_to = budget, lent
            self.lent_times += 1
            return Lend(budget=lent if lent != budget else None)
        if self.lent_from is None:
            return Lend()
        back = self.lent_from
        self.lent_from = self.lent_to = None
        return Lend(budget=back, release=True)

    @property
    def lent(self) -> bool:
        """A prompt holds the cache's room now."""
        return self.lent_from is not None

    def set_while_lent(self, budget: int) -> int:
        """Another's budget (the user's, the governor's) set while a prompt holds the room:
        it is the one to return to, and in force now as far as the lending allows; returns
        the budget in force."""
        assert self.lent_from is not None and self.lent_to is not None
        self.lent_from, self.lent_to = budget, min(budget, self.lent_to)
        return self.lent_to
