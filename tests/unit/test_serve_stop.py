"""Stop strings over streamed text: what is let out is final, and ends before the first stop."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.requests.stop import StopScanner


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], str, bool]:
    scanner = StopScanner(stops)
    out = [scanner.feed(p) for p in pieces]
    tail = scanner.finish()
    return out, "".join(out) + tail, scanner.stopped


def expected(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    """Generation stops after the first piece with which the text holds a stop string; the
    text is cut at the earliest stop string it then holds."""
    text = ""
    for piece in pieces:
        text += piece
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return text[: min(hits)], True
    return text, False


def test_a_stop_string_split_across_pieces_is_held_back_then_cut() -> None:
    out, text, stopped = run(("\n\n",), ["Hello", "\n", "\n", "world"])
    assert out == ["Hello", "", "", ""]
    assert (text, stopped) == ("Hello", True)


def test_a_held_tail_that_does_not_become_a_stop_is_let_out() -> None:
    out, text, stopped = run(("END",), ["abE", "Nx", "E"])
    assert out == ["ab", "ENx", ""]
    assert (text, stopped) == ("abENxE", False)


def test_the_earliest_of_several_stops_wins() -> None:
    assert run(("cd", "b"), ["abcd"])[1:] == ("a", True)
    assert run(("bcd", "cx"), ["ab", "cd"])[1:] == ("a", True)


def test_generation_stops_at_the_first_stop_string_complete() -> None:
    # "a\n\n" would start earlier, but "\n" is complete first: the text stops there
    assert run(("\n", "a\n\n"), ["a\n", "\n"])[1:] == ("a", True)


def test_without_stop_strings_pieces_pass_as_they_came() -> None:
    out, text, stopped = run((), ["a", "", "bc"])
    assert out == ["a", "", "bc"] and text == "abc" and not stopped


def test_pieces_after_a_stop_are_dropped() -> None:
    scanner = StopScanner(("x",))
    assert scanner.feed("axb") == "a"
    assert scanner.feed("more") == ""
    assert scanner.finish() == ""


def test_an_empty_stop_string_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopScanner(("a", ""))


alphabet = st.sampled_from("ab\n")


@settings(deadline=None, max_examples=300)
@given(
    stops=st.lists(st.text(alphabet, min_size=1, max_size=3), max_size=3).map(tuple),
    pieces=st.lists(st.text(alphabet, max_size=4), max_size=8),
)
def test_the_text_let_out_is_the_whole_text_up_to_the_first_stop(
    stops: tuple[str, ...], pieces: list[str]
) -> None:
    out, text, stopped = run(stops, pieces)
    final, _ = expected(stops, pieces)
    assert (text, stopped) == expected(stops, pieces)
    # what was let out after each piece is final: never taken back, whatever follows
    so_far = ""
    for piece in out:
        so_far += piece
        assert final.startswith(so_far)


def test_the_stop_string_that_ended_the_text_is_named() -> None:
    scanner = StopScanner(("lo", "ell", "xyz"))
    assert scanner.feed("he") == "h"  # "e" may begin "ell"
    assert scanner.matched is None
    assert scanner.feed("llo") == ""  # "ell" begins first in the text, before "lo"
    assert (scanner.stopped, scanner.matched) == (True, "ell")
    same_place = StopScanner(("a", "ab"))
    assert same_place.feed("xab") == "x"
    assert same_place.matched == "ab"
