"""The decide probe's pure part (``--decide-probe``; spec/decide.md, "Diagnostics").

What a probe observes of one decision's prefill (:class:`ProbeObservation`) becomes one
record (:class:`ProbeRecord`, one JSON line):

- the **lens**: for each layer L, the last token's state after layer L put through the
  model's output head (:class:`OutputHead`: the final norm, the head rows of the choices'
  scored tokens, the model's logit scale or soft cap), then log-softmax over the choices.
  The last token's state after layer L depends on layers 0..L only, so this is exactly what a
  prefill cut after layer L would answer about the choices. At the last layer it is the
  model's own answer: ``logp`` renormalised over the choices (``logp - logsumexp(logp)``),
  up to float rounding;
- the **routing** of the prefill: per layer and expert, the (token, slot) routings and the
  router weight they carried (after the model's normalisation of the top-k weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import numpy as np
import numpy.typing as npt

from bmoe.domain.decide.log_softmax import log_softmax
from bmoe.domain.decide.values import DecideResult

Float64s = npt.NDArray[np.float64]
NormKind = Literal["rms", "layer"]
WSUM_DECIMALS = 6  # the record's summed weights: a millionth of a routing is plenty


def _f64(value: npt.ArrayLike) -> Float64s:
    return np.asarray(value, dtype=np.float64)


def _optional_f64(value: npt.ArrayLike | None) -> Float64s | None:
    return None if value is None else _f64(value)


@attrs.frozen(eq=False)
class OutputHead:
    """How the model turns a state into logits after its last layer, as llama.cpp's graph does:

    1. the final norm: ``rms`` (``x / sqrt(mean(x^2) + eps)``) or ``layer`` (``(x - mean) /
       sqrt(var + eps)``), times ``norm_weight``, plus ``norm_bias`` when the model has one;
    2. the head: one row per token asked for (``output.weight``, or ``token_embd`` when tied);
    3. ``logit_scale`` (a factor: granite's ``1 / logit_scale``), then ``softcap`` (when > 0:
       ``softcap * tanh(x / softcap)``, gemma's final soft cap).
    """

    norm_weight: Float64s = attrs.field(converter=_f64)
    eps: float
    norm_kind: NormKind = "rms"
    norm_bias: Float64s | None = attrs.field(default=None, converter=_optional_f64)
    logit_scale: float = 1.0
    softcap: float = 0.0

    def __attrs_post_init__(self) -> None:
        if self.norm_weight.ndim != 1 or self.norm_weight.size == 0:
            raise ValueError(f"norm_weight must be one non-empty row, not shape {self.norm_weight.shape}")
        if self.norm_bias is not None and self.norm_bias.shape != self.norm_weight.shape:
            raise ValueError(f"norm_bias has shape {self.norm_bias.shape}, not {self.norm_weight.shape}")
        if self.norm_kind not in ("rms", "layer"):
            raise ValueError(f"unknown norm kind {self.norm_kind!r}")
        if self.eps < 0 or self.softcap < 0:
            raise ValueError("eps and softcap must be >= 0")

    @property
    def n_embd(self) -> int:
        return int(self.norm_weight.size)

    def normed(self, states: npt.ArrayLike) -> Float64s:
        """The final norm of each state (the last axis is the embedding), in float64."""
        x = _f64(states)
        if self.norm_kind == "layer":
            x = x - np.mean(x, axis=-1, keepdims=True)
        out: Float64s = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.norm_weight
        if self.norm_bias is not None:
            out = out + self.norm_bias
        return out

    def logits(self, states: npt.ArrayLike, rows: npt.ArrayLike) -> Float64s:
        """Logits ``[..., n_rows]`` of the tokens whose head ``rows`` (``[n_rows, n_embd]``) are
        given, for states ``[..., n_embd]``."""
        head = _f64(rows)
        if head.ndim != 2 or head.shape[1] != self.n_embd:
            raise ValueError(f"head rows must be [n, {self.n_embd}], not {head.shape}")
        out: Float64s = (self.normed(states) @ head.T) * self.logit_scale
        if self.softcap > 0:
            out = self.softcap * np.tanh(out / self.softcap)
        return out


@attrs.frozen(eq=False)
class ProbeObservation:
    """What a probe saw of one decision's prefill.

    - ``seq``: the decision's number among those the session's probe recorded (from 0);
    - ``states`` ``[n_layer, n_embd]``: the last token's state at the end of each layer, and
      ``seen`` ``[n_layer]``, which layers had one (a layer the graph does not name is not);
    - ``head`` and ``rows`` ``[n_choice, n_embd]``: the output head and the head rows of the
      choices' scored tokens, in the choices' order;
    - ``cnt`` / ``wsum`` ``[n_layer, n_expert]``: the prefill's (token, slot) routings per
      layer and expert, and the router weight they carried; ``nu``: experts per token.
    """

    seq: int
    states: npt.NDArray[np.float32]
    seen: npt.NDArray[np.bool_]
    head: OutputHead
    rows: npt.NDArray[np.float32]
    cnt: npt.NDArray[np.int64]
    wsum: Float64s
    nu: int

    def __attrs_post_init__(self) -> None:
        n_layer = self.states.shape[0]
        if self.states.ndim != 2 or self.seen.shape != (n_layer,):
            raise ValueError(f"states {self.states.shape} and seen {self.seen.shape} do not match")
        if self.cnt.shape != self.wsum.shape or self.cnt.ndim != 2 or self.cnt.shape[0] != n_layer:
            raise ValueError(f"cnt {self.cnt.shape} and wsum {self.wsum.shape} must be [{n_layer}, n_expert]")


def lens(observation: ProbeObservation) -> tuple[tuple[float, ...] | None, ...]:
    """Per layer, the choices' log-probabilities renormalised over the choices, read from the
    last token's state after that layer (None for a layer whose state was not seen)."""
    logits = observation.head.logits(observation.states, observation.rows)
    logp = log_softmax(logits)
    return tuple(
        tuple(float(v) for v in logp[layer]) if observation.seen[layer] else None
        for layer in range(logp.shape[0])
    )


def _json_float(value: float) -> float | None:
    """JSON has no infinities: a choice the model rules out (``-inf``) is written ``null``."""
    return value if np.isfinite(value) else None


@attrs.frozen
class ProbeRecord:
    """One decision as the probe writes it (one JSON line, keys in this order).

    ``seq``, ``n_tokens`` (the prompt), ``n_prefilled`` (the tokens this decision computed:
    a restored prefix is not prefilled again, so its routings are not counted), ``prefill_s``,
    ``choices``, decide's own ``best`` and ``logp``, then ``lens`` (see :func:`lens`), ``nu``,
    ``cnt`` and ``wsum`` (per layer, per expert).
    """

    seq: int
    n_tokens: int
    n_prefilled: int
    prefill_s: float
    choices: tuple[str, ...]
    best: int
    logp: tuple[float, ...]
    lens: tuple[tuple[float, ...] | None, ...]
    nu: int
    cnt: tuple[tuple[int, ...], ...]
    wsum: tuple[tuple[float, ...], ...]

    def as_json(self) -> dict[str, object]:
        """The record as JSON values (``-inf`` as ``null``), keys in the documented order."""
        return {
            "seq": self.seq,
            "n_tokens": self.n_tokens,
            "n_prefilled": self.n_prefilled,
            "prefill_s": self.prefill_s,
            "choices": list(self.choices),
            "best": self.best,
            "logp": [_json_float(v) for v in self.logp],
            "lens": [None if row is None else [_json_float(v) for v in row] for row in self.lens],
            "nu": self.nu,
            "cnt": [list(row) for row in self.cnt],
            "wsum": [list(row) for row in self.wsum],
        }


def probe_record(observation: ProbeObservation, choices: Sequence[str], result: DecideResult) -> ProbeRecord:
    """The record of an answered decision (``result``) from what the probe observed."""
    if observation.rows.shape[0] != len(choices) or len(result.choice_logp) != len(choices):
        raise ValueError(
            f"{len(choices)} choices, {observation.rows.shape[0]} head rows, {len(result.choice_logp)} scores"
        )
    return ProbeRecord(
        seq=observation.seq,
        n_tokens=result.n_tokens,
        n_prefilled=result.n_prefilled,
        prefill_s=result.prefill_s,
        choices=tuple(choices),
        best=result.best,
        logp=result.choice_logp,
        lens=lens(observation),
        nu=observation.nu,
        cnt=tuple(tuple(int(c) for c in row) for row in observation.cnt),
        wsum=tuple(tuple(round(float(w), WSUM_DECIMALS) for w in row) for row in observation.wsum),
    )
