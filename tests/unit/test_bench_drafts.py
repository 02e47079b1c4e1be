"""``bench --draft copy``'s pure parts: the teacher-forced decode with drafts (against a
scripted context that checks every position it is fed), the transcripts, the tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from bmoe.bench.decode import teacher_force
from bmoe.bench.draft_decode import teacher_force_drafted
from bmoe.bench.draft_report import accept_table, end_to_end_table, union_tables
from bmoe.bench.draft_texts import agent_edit, plain
from bmoe.domain.drafting import DraftPolicy

VOCAB = 50


class ScriptedContext:
    """A KV as a list of tokens; its "model" chooses ``(token * 7 + position) % VOCAB`` after
    each token, the same whether a row is decoded alone or in a batch."""

    def __init__(self, prompt: Sequence[int]) -> None:
        self.kv = list(prompt)
        self.batches: list[int] = []  # rows of each decode

    @staticmethod
    def choice(token: int, pos: int) -> int:
        return (token * 7 + pos) % VOCAB

    def step(self, token: int, pos: int) -> None:
        assert pos == len(self.kv), "fed at a position that is not the KV's end"
        self.kv.append(token)
        self.batches.append(1)

    def argmax(self) -> int:
        return self.choice(self.kv[-1], len(self.kv) - 1)

    def step_rows(self, tokens: Sequence[int], pos: int) -> np.ndarray[Any, Any]:
        assert pos == len(self.kv)
        rows = np.zeros((len(tokens), VOCAB), dtype=np.float32)
        for i, t in enumerate(tokens):
            rows[i, self.choice(t, pos + i)] = 1.0
        self.kv += tokens
        self.batches.append(len(tokens))
        return rows

    def cut(self, keep: int) -> None:
        assert keep <= len(self.kv)
        del self.kv[keep:]


def copying_text() -> list[int]:
    """Forty distinct tokens, then the same forty again with one changed: a reply that copies."""
    first = list(range(40))
    second = list(first)
    second[25] = 45
    return [*first, 46, 47, *second]


@pytest.mark.parametrize("warmup", [0, 3])
def test_drafts_feed_what_plain_steps_feed_and_choose_the_same(warmup: int) -> None:
    tokens = copying_text()
    start, measure = 10, len(tokens) - 10 - warmup
    plain_ctx, drafted_ctx = ScriptedContext(tokens[:start]), ScriptedContext(tokens[:start])
    plain_run = teacher_force(plain_ctx, tokens, warmup, measure, start=start)
    run = teacher_force_drafted(drafted_ctx, tokens, start, measure, DraftPolicy(), warmup=warmup)
    assert run.measured == measure and run.warmup == warmup
    assert drafted_ctx.kv == plain_ctx.kv == tokens  # rejected rows cut: the KV plain steps leave
    assert run.argmax == plain_run.argmax  # the greedy choice after every fed token
    d = run.drafts
    assert d.verifies >= 1 and d.accepted >= 8
    assert max(drafted_ctx.batches) > 1  # a verify batch
    assert sum(1 for b in drafted_ctx.batches) == len(run.step_s) + warmup
    # emitted = plain steps + verifies' accepted tokens and own next tokens
    assert len(run.step_s) - d.verifies + d.accepted + d.verifies == measure


def test_a_draft_is_rejected_where_the_transcript_changes() -> None:
    tokens = copying_text()
    ctx = ScriptedContext(tokens[:49])  # the copy has begun: 49 = 40 + 2 + 7
    run = teacher_force_drafted(ctx, tokens, 49, len(tokens) - 49, DraftPolicy())
    assert run.drafts.drafted > run.drafts.accepted  # token 25 of the copy differs
    assert ctx.kv == tokens


def test_text_that_does_not_repeat_is_never_drafted() -> None:
    tokens = list(range(45))
    ctx = ScriptedContext(tokens[:5])
    run = teacher_force_drafted(ctx, tokens, 5, 40, DraftPolicy())
    assert run.drafts.verifies == 0 and ctx.batches == [1] * 40


def test_asking_past_the_sequence_is_refused() -> None:
    with pytest.raises(ValueError):
        teacher_force_drafted(ScriptedContext([]), [1, 2, 3], 1, 3, DraftPolicy())


def test_the_edit_transcript_copies_its_file_and_the_plain_one_does_not_on_purpose() -> None:
    edit = agent_edit()
    assert "old_str=" in edit.reply and "new_str=" in edit.reply
    old = edit.reply.split('old_str="', 1)[1].split('"', 1)[0]
    assert old in edit.prompt  # copied from the file the agent read
    file_text = edit.prompt.split("Tool: ", 1)[1]
    assert "by two metres" in edit.reply and "by two metres" not in file_text  # the change
    prose = plain()
    assert prose.reply not in prose.prompt and "edit_file" not in prose.reply


def test_the_tables_say_a_failure_and_the_cost_of_a_draft() -> None:
    assert accept_table({"error": "boom"}) == ["failed: boom"]
    union = {
        "union": [
            {"rows": n, "batches": 10, "mib_per_batch": mib, "mib_per_row": mib / n, "s_per_batch": 0.1}
            for n, mib in ((1, 10.0), (9, 40.0), (17, 60.0), (33, 80.0), (64, 100.0))
        ]
    }
    text = "\n".join(union_tables(union))
    assert "| 8 | 40.0 | 13.3 | 8.0 | 4.4 |" in text  # 40 / 1, 40 / 3, 40 / 5, 40 / 9
    runs = [
        {"transcript": "agent edit", "draft": "off", "round": 0, "tok_s": 2.0, "measured_tokens": 10,
         "counters": {"bytes_read": 100 << 20}, "argmax": [1, 2, 3]},
        {"transcript": "agent edit", "draft": "copy", "round": 0, "tok_s": 4.0, "measured_tokens": 10,
         "counters": {"bytes_read": 40 << 20}, "argmax": [1, 2, 4],
         "drafts": {"verifies": 2, "drafted": 10, "accepted": 6, "paused": 0}},
    ]  # fmt: skip
    table = "\n".join(end_to_end_table(runs))
    row = (
        "| agent edit | copy | 4.00 | 4.0 | 4.00 (6 of 10 accepted, paused 0) | "
        + "2.00x | 0.40x | 2 of 3 equal |"
    )
    assert row in table
