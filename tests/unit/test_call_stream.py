"""``CallStreamer``: a reply fed character by character gives OpenAI's call deltas (a first
with id and name, then argument pieces) that join to exactly the calls ``parse_reply``
reads from the whole reply, in every family it streams; a cut reply too."""

from __future__ import annotations

import itertools

import pytest

from bmoe.domain.tools import ReplyGate, ToolFormat, parse_reply
from bmoe.domain.tools.call_stream import CallDelta, CallStreamer

ARGS = '{"city": "Paris", "days": [1, 2], "deep": {"a": "}", "name": "inner"}}'
REPLIES = {
    ToolFormat.HERMES: (
        f'<tool_call>\n{{"name": "weather", "arguments": {ARGS}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "time", "arguments": {}}\n</tool_call>'
    ),
    ToolFormat.MISTRAL: (
        f'[TOOL_CALLS][{{"name": "weather", "arguments": {ARGS}}}, {{"name": "time", "arguments": {{}}}}]'
    ),
    ToolFormat.MISTRAL_ARGS: f"[TOOL_CALLS]weather[ARGS]{ARGS}[TOOL_CALLS]time[ARGS]{{}}",
    ToolFormat.LLAMA3: f'{{"name": "weather", "parameters": {ARGS}}}',
}


def _ids() -> object:
    counter = itertools.count()
    return lambda: f"s{next(counter)}"


def _stream(
    fmt: ToolFormat, text: str, cut: bool = False
) -> tuple[list[CallDelta], list[tuple[str, str, str]]]:
    gate = ReplyGate(fmt)
    streamer = CallStreamer(fmt, new_id=_ids())
    deltas: list[CallDelta] = []
    for ch in text:
        gate.feed(ch)
        deltas += streamer.feed(gate.held)
    rest, final = streamer.finish(parse_reply(fmt, text, cut=cut).calls)
    deltas += rest
    return deltas, [(c.id, c.name, c.arguments) for c in final]


def _joined(deltas: list[CallDelta]) -> list[tuple[str, str, str]]:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.id:
            assert d.index not in calls, "a call's id and name come once, first"
            calls[d.index] = [d.id, d.name, d.arguments]
        else:
            calls[d.index][2] += d.arguments
    return [tuple(calls[i]) for i in sorted(calls)]  # type: ignore[misc]


@pytest.mark.parametrize("fmt", sorted(REPLIES, key=lambda f: f.value))
def test_deltas_join_to_the_whole_replys_calls_with_the_streamed_ids(fmt: ToolFormat) -> None:
    deltas, final = _stream(fmt, REPLIES[fmt])
    whole = parse_reply(fmt, REPLIES[fmt])
    assert [(n, a) for _, n, a in final] == [(c.name, c.arguments) for c in whole.calls]
    assert _joined(deltas) == final
    assert final[0][2] == ARGS  # the arguments as the model wrote them
    weather = [d for d in deltas if d.index == 0]
    assert len(weather) > 5  # streamed while written


def test_a_cut_reply_streams_the_arguments_so_far() -> None:
    text = REPLIES[ToolFormat.HERMES][:58]
    deltas, final = _stream(ToolFormat.HERMES, text, cut=True)
    assert final == [("s0", "weather", '{"city": "Par')]
    assert _joined(deltas) == final


def test_no_delta_before_the_name_is_whole_and_the_openai_shape() -> None:
    streamer = CallStreamer(ToolFormat.HERMES, new_id=_ids())
    assert streamer.feed('<tool_call>\n{"name": "weat') == []
    (first,) = streamer.feed('<tool_call>\n{"name": "weather", "arguments": {"a"')
    assert first.as_openai() == {
        "index": 0,
        "id": "s0",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"a"'},
    }
    (more,) = streamer.feed('<tool_call>\n{"name": "weather", "arguments": {"a": 1')
    assert more.as_openai() == {"index": 0, "function": {"arguments": ": 1"}}
