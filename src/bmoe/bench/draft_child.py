"""The two ``bench --draft copy`` measures that are not a teacher-forced decode, each run in
the child process (``spec["mode"]``):

- ``accept``: the model's own choices. A resident session with ``--draft copy`` answers each
  prompt greedily twice, drafts on and off (the request's ``draft`` field), in turn: tokens a
  verify, drafted and accepted tokens, both decode rates, and whether the two answers are the
  same tokens (where not: the first position that differs, and the logit margin there of the
  plain run's choice over the drafted run's, from a fresh resident decode of the plain
  answer: a near-tie the batch's kernels decided otherwise).
- ``union``: what a verify batch reads. Streamed with the expert cache off, each batch reads
  every expert its rows route to once, so the bytes read per batch are the union of the
  rows' experts: the reply's tokens are fed in batches of ``n`` consecutive tokens for each
  ``n`` asked, from the prompt's end each time (the rest cut), and the MiB read a batch and a
  row are returned. Teacher-forced: the rows are the reply's tokens, as a draft accepted whole.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np


def _session(spec: dict[str, Any], streamed: bool, cache_mib: int | None, draft: str) -> Any:
    from bmoe.adapters.llama import ContextParams
    from bmoe.domain.streaming import StreamConfig
    from bmoe.runtime import Session, SessionConfig

    config = SessionConfig(
        model_path=Path(spec["model"]),
        context=ContextParams(n_ctx=spec["n_ctx"], n_threads=spec["threads"], flash_attn="off"),
        stream=StreamConfig(enabled=streamed, cache_mb=cache_mib, io_threads=spec["io_threads"]),
        draft=draft,  # type: ignore[arg-type]
    )
    return Session.open(config)


def _margin(session: Any, prompt: str, tokens: list[int], at: int, other: int) -> float:
    """Resident, one prefill: the logit of ``tokens[at]`` minus that of ``other`` after the
    prompt and ``tokens[:at]``. It decodes into the session's context behind its engine's
    back: the last thing done with a session."""
    from bmoe.domain.generation import GenerateRequest

    ids = list(session.engine.render_prompt(GenerateRequest(prompt=prompt), chat=False)) + tokens[:at]
    session.ctx.remove_from(0)
    session.ctx.decode(ids, 0)
    row = session.last_logits()
    return float(row[tokens[at]] - row[other])


def run_accept(spec: dict[str, Any]) -> dict[str, Any]:
    from bmoe.domain.generation import GenerateRequest

    session = _session(spec, streamed=False, cache_mib=None, draft="copy")
    out: list[dict[str, Any]] = []
    differ: list[tuple[dict[str, Any], str, list[int], int, int]] = []
    try:
        for name, prompt in spec["prompts"]:
            runs: dict[bool, list[Any]] = {}
            for draft in (False, True, False, True):  # A B A B: the rates are compared
                r = session.generate(
                    GenerateRequest(prompt=prompt, n_predict=spec["measure"], draft=draft), chat=False
                )
                runs.setdefault(draft, []).append(r)
            off, on = runs[False][-1], runs[True][-1]
            d = on.drafts
            row: dict[str, Any] = {
                "name": name,
                "tokens": len(on.tokens),
                "tok_s_off": [r.tok_s for r in runs[False]],
                "tok_s_on": [r.tok_s for r in runs[True]],
                "verifies": d.verifies if d else 0,
                "drafted": d.drafted if d else 0,
                "accepted": d.accepted if d else 0,
                "per_verify": d.per_verify if d else 0.0,
                "same": list(off.tokens) == list(on.tokens),
                "text_on": on.text[:200],
            }
            if not row["same"]:
                at = next(
                    (i for i, (a, b) in enumerate(zip(off.tokens, on.tokens, strict=False)) if a != b),
                    min(len(off.tokens), len(on.tokens)),
                )
                row["first_difference"] = at
                if at < min(len(off.tokens), len(on.tokens)):
                    differ.append((row, prompt, list(off.tokens), at, on.tokens[at]))
            out.append(row)
        for row, prompt, tokens, at, other in differ:
            row["margin"] = _margin(session, prompt, tokens, at, other)
    finally:
        session.close()
    return {"key": spec["key"], "accept": out}


def run_union(spec: dict[str, Any]) -> dict[str, Any]:
    session = _session(spec, streamed=True, cache_mib=0, draft="off")
    prompt: list[int] = spec["prompt_ids"]
    reply: list[int] = spec["reply_ids"][: spec["measure"]]
    out: list[dict[str, Any]] = []
    try:
        backend, streaming = session.engine.backend, session.streaming
        if streaming is None:
            raise RuntimeError(f"the session does not stream: {session.notes}")
        backend.feed(prompt, 0)
        for n in spec["sizes"]:
            backend.keep_prefix(len(prompt))
            batches = len(reply) // n
            before = streaming.counters()
            t = time.perf_counter()
            for b in range(batches):  # as verifies: one decode step of n rows each
                backend.feed_rows(reply[b * n : (b + 1) * n], len(prompt) + b * n)
            wall = time.perf_counter() - t
            after = streaming.counters()
            read = (after.bytes_read - before.bytes_read) / (1 << 20)
            out.append(
                {
                    "rows": n,
                    "batches": batches,
                    "mib_per_batch": read / batches,
                    "mib_per_row": read / (batches * n),
                    "s_per_batch": wall / batches,
                }
            )
        finite = bool(np.all(np.isfinite(session.last_logits())))
    finally:
        session.close()
    return {"key": spec["key"], "union": out, "finite_logits": finite}


def run_mode(spec: dict[str, Any]) -> dict[str, Any]:
    return run_accept(spec) if spec["mode"] == "accept" else run_union(spec)
