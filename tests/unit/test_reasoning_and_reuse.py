"""Reasoning split and KV prefix reuse policy (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bmoe.domain.kv_reuse import common_prefix_len, plan_reuse, swa_prefix_usable
from bmoe.domain.reasoning import Delta, ReasoningSplitter


def split_all(pieces: list[str]) -> tuple[str, str]:
    splitter = ReasoningSplitter()
    deltas = [splitter.feed(p) for p in pieces] + [splitter.finish()]
    return "".join(d.text for d in deltas), "".join(d.reasoning for d in deltas)


def test_reasoning_span_goes_to_its_own_field() -> None:
    assert split_all(["<think>", "hmm, ", "fine", "</think>", "\n\n", "OK!"]) == ("OK!", "hmm, fine")


def test_tags_cut_anywhere_are_still_found() -> None:
    whole = "<think>a < b</think>\n\nanswer <t"
    for cut in range(1, len(whole)):
        assert split_all([whole[:cut], whole[cut:]]) == ("answer <t", "a < b")


@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=30))
def test_any_chunking_gives_the_same_split(sizes: list[int]) -> None:
    whole = "  <think>\nplan: x</thi</think>\n Done </think> <think>"
    pieces, at = [], 0
    for size in sizes:
        pieces.append(whole[at : at + size])
        at += size
    pieces.append(whole[at:])
    assert split_all(pieces) == split_all([whole]) == ("Done </think> <think>", "\nplan: x</thi")


def test_output_without_thinking_is_all_answer() -> None:
    assert split_all(["Hello", " <think> is text here"]) == ("Hello <think> is text here", "")


def test_unfinished_reasoning_stays_reasoning() -> None:
    assert split_all(["<think>still going</th"]) == ("", "still going</th")


def test_a_lone_tag_prefix_at_the_start_is_text() -> None:
    assert split_all(["<thi"]) == ("<thi", "")
    assert ReasoningSplitter().feed("<th") == Delta()


def test_common_prefix() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0


@pytest.mark.parametrize(
    ("memory", "prompt", "keep", "trim"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6], 4, False),  # continuation: prefill only the new part
        ([1, 2, 3, 4], [1, 2, 9, 9], 2, True),  # divergence: remove the tail
        ([1, 2, 3], [1, 2, 3], 2, True),  # same prompt: recompute the last token for its logits
        ([], [7, 8], 0, False),
        ([5, 6], [7], 0, True),
    ],
)
def test_reuse_plan(memory: list[int], prompt: list[int], keep: int, trim: bool) -> None:
    plan = plan_reuse(memory, prompt)
    assert (plan.keep, plan.trim) == (keep, trim)


def test_swa_prefix_is_refused_once_cells_left_the_window() -> None:
    assert swa_prefix_usable(keep=100, pos_min=0, n_swa=32)
    assert swa_prefix_usable(keep=100, pos_min=67, n_swa=32)
    assert not swa_prefix_usable(keep=100, pos_min=68, n_swa=32)
    assert swa_prefix_usable(keep=100, pos_min=90, n_swa=0)
    assert swa_prefix_usable(keep=0, pos_min=50, n_swa=32)
    assert swa_prefix_usable(keep=0, pos_min=-1, n_swa=32)
    assert not swa_prefix_usable(keep=19, pos_min=-1, n_swa=32)  # the window lost all it kept
    assert not swa_prefix_usable(keep=19, pos_min=5, n_swa=32)
