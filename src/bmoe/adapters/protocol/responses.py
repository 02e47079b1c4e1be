"""What the session answers: one frozen class per ``BMOE_*`` tag of docs/protocol.md.

The fields are the line's keys, in the order they are written. ``-1`` stands for a figure
that is not measured (``cache_hit_pct`` with no expert cache, the streaming figures of a
model run resident), and is the default of every such field. Times are seconds unless the
name ends in ``_ms``; sizes MiB unless it ends in ``_mb``.

Keys may be added to these classes in later versions (a client must ignore keys it does not
know; ``ResponseReader`` does); none will be renamed or removed.

Arguments are keyword-only. Numbers are stored as plain ``int``/``float`` whatever numeric
type was given (numpy scalars included), so every event can be written as JSON. A float that
is NaN or infinite is written as ``null`` and reads back as NaN; in ``choice_logp`` it reads
back as ``None`` (see ``DecideDone``).
"""

from __future__ import annotations

from typing import ClassVar, TypeAlias

import attrs

from bmoe.adapters.protocol.checks import (
    RequestId,
    as_float,
    as_float_or_none_tuple,
    as_int,
    check_bool,
    check_id,
    check_str,
    typed,
)

NOT_MEASURED = -1.0
"""The value of a figure that is not measured."""

_is_id = typed(check_id)
_is_bool = typed(check_bool)
_is_str = typed(check_str)


@attrs.frozen(kw_only=True)
class Ready:
    """``BMOE_READY``, once, when the model is open.

    - ``load_s``: seconds the model took to open.
    - ``arch``: the model's architecture (``general.architecture``, e.g. ``qwen3moe``).
    - ``n_ctx``: the context length fixed at open; prompt plus ``n_predict`` must fit.
    - ``n_expert_used``: experts routed per token.
    - ``think_ctl``: whether the chat template honours ``enable_thinking``, i.e. whether a
      request's ``think`` changes anything.
    - ``repacked``: whether weights compute in llama.cpp's repacked layout (``CPU_REPACK``);
      ``weights``: which, in words (the ``mode:`` line's).
    - ``placement``: with layers on a device (``-ngl``), what sits where (the ``mode:``
      line's ``placement:`` part); empty otherwise.
    """

    TAG: ClassVar[str] = "BMOE_READY"

    load_s: float = attrs.field(converter=as_float)
    arch: str = attrs.field(validator=_is_str)
    n_ctx: int = attrs.field(converter=as_int)
    n_expert_used: int = attrs.field(converter=as_int)
    think_ctl: bool = attrs.field(validator=_is_bool)
    repacked: bool = attrs.field(validator=_is_bool, default=False)
    weights: str = attrs.field(validator=_is_str, default="")
    placement: str = attrs.field(validator=_is_str, default="")


@attrs.frozen(kw_only=True)
class Begin:
    """``BMOE_BEGIN``: the request ``id`` starts (requests run one at a time, in order)."""

    TAG: ClassVar[str] = "BMOE_BEGIN"

    id: RequestId = attrs.field(validator=_is_id)


@attrs.frozen(kw_only=True)
class ProgressBudgetChange:
    """One change the memory-pressure governor made to the expert cache's budget: from
    ``from_mib`` to ``to_mib``, and ``why`` in words (``shrink: ...`` or ``grow: ...``, the
    ``moe-governor:`` line's reason)."""

    from_mib: float = attrs.field(converter=as_float)
    to_mib: float = attrs.field(converter=as_float)
    why: str = attrs.field(validator=_is_str)


@attrs.frozen(kw_only=True)
class Progress:
    """``BMOE_PROGRESS``, per decoded token of the generate in flight.

    - ``step``: tokens decoded so far (1 for the first), of at most ``steps`` (the request's
      ``n_predict``).
    - ``wall_ms``: this token's wall time; ``io_ms``, ``compute_ms``, ``mgmt_ms`` (cache
      management), ``stall_ms`` (waiting for a read): its parts, when measured.
    - ``read_mb``: bytes read from the model file for this token, in MB.
    - ``cache_hit_pct``: expert cache hit rate so far, 0 to 100.
    - ``delta_text``, ``delta_reasoning``: the answer and reasoning text this token completed
      (whole UTF-8 characters only, so possibly empty).
    - ``cache_resident_mib``, ``cache_budget_mib`` (beyond the C++ engine's keys): the expert
      cache's fill and budget after this token.
    - ``budget_changes`` (beyond them too): the governor's changes to the budget since the
      previous ``BMOE_PROGRESS`` line (since the session opened, for its first), oldest first;
      empty when there were none.
    """

    TAG: ClassVar[str] = "BMOE_PROGRESS"

    step: int = attrs.field(converter=as_int)
    steps: int = attrs.field(converter=as_int)
    wall_ms: float = attrs.field(converter=as_float)
    io_ms: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    compute_ms: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    mgmt_ms: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    stall_ms: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    read_mb: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    cache_hit_pct: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    delta_text: str = attrs.field(validator=_is_str, default="")
    delta_reasoning: str = attrs.field(validator=_is_str, default="")
    cache_resident_mib: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    cache_budget_mib: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    budget_changes: tuple[ProgressBudgetChange, ...] = ()


@attrs.frozen(kw_only=True)
class DoneToolCall:
    """One call a reply made: its ``id``, the function's ``name``, ``arguments`` as JSON text."""

    id: str = attrs.field(validator=_is_str)
    name: str = attrs.field(validator=_is_str)
    arguments: str = attrs.field(validator=_is_str)


@attrs.frozen(kw_only=True)
class DoneLogprob:
    """One generated token: its ``token`` id, its ``text``, its ``logprob`` and the ``top``
    alternatives as ``[token, logprob]`` pairs, most likely first."""

    token: int = attrs.field(converter=as_int)
    text: str = attrs.field(validator=_is_str)
    logprob: float = attrs.field(converter=as_float)
    top: tuple[tuple[int, float], ...] = ()


@attrs.frozen(kw_only=True)
class Done:
    """``BMOE_DONE``: a generate ended (finished, or ``cancelled``).

    - ``tokens``: tokens generated; ``tok_s`` the decode rate.
    - ``prefill_s``, ``prefill_tps``: the prompt phase's time and rate.
    - ``load_s``: the model's load time (the same as ``BMOE_READY``'s).
    - ``n_prompt``: tokens actually prefilled this turn (a continued chat reuses the rest);
      ``n_past``: the context length after the turn, prompt and generated tokens;
      ``n_restored``: of the prompt's tokens not prefilled, those a state kept in the
      prompt cache held (``--cache-ram``; 0 without one).
    - ``cache_hit_pct``: expert cache hit rate, 0 to 100.
    - ``read_mib``: MiB read from the model file while decoding; ``io_s_tok``,
      ``compute_s_tok``, ``mgmt_s_tok``, ``stall_s_tok``: per-token seconds of reading,
      computing, cache management and waiting for reads.
    - ``cache_resident_mib``, ``cache_budget_mib``: the expert cache's fill and budget.
    - ``prefill_read_mib``, ``prefill_io_s``, ``prefill_stall_s``: what the prompt phase read,
      the lanes' busy time reading it, and the time the compute waited for it.
    - ``text``: the answer; ``reasoning``: the reasoning span, kept apart from it.
    - ``tool_calls``: the calls the reply made (a request with ``tools``; ``text`` is then
      what it said outside them); ``logprobs``: per token, when asked for.
    """

    TAG: ClassVar[str] = "BMOE_DONE"

    id: RequestId = attrs.field(validator=_is_id)
    cancelled: bool = attrs.field(validator=_is_bool)
    tokens: int = attrs.field(converter=as_int)
    tok_s: float = attrs.field(converter=as_float)
    prefill_s: float = attrs.field(converter=as_float)
    prefill_tps: float = attrs.field(converter=as_float)
    load_s: float = attrs.field(converter=as_float)
    n_prompt: int = attrs.field(converter=as_int)
    n_past: int = attrs.field(converter=as_int)
    n_restored: int = attrs.field(converter=as_int, default=0)
    cache_hit_pct: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    read_mib: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    io_s_tok: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    compute_s_tok: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    mgmt_s_tok: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    stall_s_tok: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    cache_resident_mib: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    cache_budget_mib: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    prefill_read_mib: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    prefill_io_s: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    prefill_stall_s: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    text: str = attrs.field(validator=_is_str)
    reasoning: str = attrs.field(validator=_is_str, default="")
    tool_calls: tuple[DoneToolCall, ...] = ()
    logprobs: tuple[DoneLogprob, ...] = ()


@attrs.frozen(kw_only=True)
class DecideDone:
    """``BMOE_DECIDE``: a decision ended (spec/decide.md).

    - ``best``: the index of the highest ``choice_logp``.
    - ``choice_logp``: per choice, the log-probability of its first token over the whole
      vocabulary. Minus infinity (a token the model rules out) is written as ``null`` and
      reads back as ``None``; a NaN likewise.
    - ``n_tokens`` = ``n_reused`` (restored from the kept prefix state) + ``n_prefilled``.
    - ``restore_s``: time to put the kept state back (0 when none was used); ``store_s``:
      time to copy the state after the prefix (not part of ``prefill_s``).
    - ``prefill_s``, ``prefill_tps``, ``prefill_read_mib``, ``prefill_io_s``,
      ``prefill_stall_s``: the prompt phase, as in ``BMOE_DONE``.
    - ``prefix_state_mib``: the size of the state kept after this decision (0 when none).
      A cancelled decision stores nothing.
    - ``choice_p_renorm`` (beyond the C++ engine's keys): the choices' probabilities
      renormalised over the choices alone (they sum to 1; all 0 when every choice is ruled out).
    - ``prefix_plan`` (beyond them too): with ``--decide-prefix-cache auto`` and a new prefix
      to keep, whether it was kept or the prompt prefilled in one piece, and why; else "".
    """

    TAG: ClassVar[str] = "BMOE_DECIDE"

    id: RequestId = attrs.field(validator=_is_id)
    cancelled: bool = attrs.field(validator=_is_bool)
    best: int = attrs.field(converter=as_int)
    choice_logp: tuple[float | None, ...] = attrs.field(converter=as_float_or_none_tuple)
    n_tokens: int = attrs.field(converter=as_int)
    n_reused: int = attrs.field(converter=as_int)
    n_prefilled: int = attrs.field(converter=as_int)
    restore_s: float = attrs.field(converter=as_float)
    store_s: float = attrs.field(converter=as_float)
    prefill_s: float = attrs.field(converter=as_float)
    prefill_tps: float = attrs.field(converter=as_float)
    prefill_read_mib: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    prefill_io_s: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    prefill_stall_s: float = attrs.field(converter=as_float, default=NOT_MEASURED)
    prefix_state_mib: float = attrs.field(converter=as_float)
    choice_p_renorm: tuple[float | None, ...] = attrs.field(converter=as_float_or_none_tuple, default=())
    prefix_plan: str = attrs.field(validator=_is_str, default="")


@attrs.frozen(kw_only=True)
class Error:
    """``BMOE_ERROR``: a request (``id``, ``None`` when the line had none) was refused or
    failed. ``fatal=False``: the session goes on with the next line. ``fatal=True``: the
    session is unusable and the process exits non-zero after this line."""

    TAG: ClassVar[str] = "BMOE_ERROR"

    id: RequestId = attrs.field(validator=_is_id)
    fatal: bool = attrs.field(validator=_is_bool)
    msg: str = attrs.field(validator=_is_str)


Response: TypeAlias = Ready | Begin | Progress | Done | DecideDone | Error
"""Any line the session writes."""

RESPONSE_TYPES: dict[str, type[Response]] = {
    cls.TAG: cls for cls in (Ready, Begin, Progress, Done, DecideDone, Error)
}
"""Tag -> response class."""
