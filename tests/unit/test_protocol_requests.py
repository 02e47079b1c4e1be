"""The request side of the session protocol: lines in, request events or BadRequest out."""

from __future__ import annotations

import itertools
import json

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bmoe.adapters.protocol import (
    DEFAULT_MAX_LINE_BYTES,
    BadRequest,
    CancelCmd,
    CloseCmd,
    DecideCmd,
    EndOfInput,
    GenerateCmd,
    ProtocolError,
    ReaderEvent,
    Request,
    RequestReader,
    parse_request,
)
from bmoe.errors import BmoeError, ConfigError

# -- the request classes, built directly ---------------------------------------------------


def test_generate_defaults_mean_the_sessions_setting_and_a_new_chat() -> None:
    cmd = GenerateCmd(prompt="Hi")
    assert (cmd.id, cmd.n_predict, cmd.think, cmd.clear_kv) == (None, None, None, True)


def test_decide_defaults_reuse_the_prefix_and_leave_either_part_empty() -> None:
    cmd = DecideCmd(suffix="Answer:", choices=("A", "B"))
    assert (cmd.id, cmd.prefix, cmd.reuse_prefix) == (None, "", True)


def test_choices_given_as_a_list_are_stored_as_a_tuple_so_requests_hash() -> None:
    cmd = DecideCmd(prefix="p", choices=["A", "B"])
    assert cmd.choices == ("A", "B")
    assert hash(cmd) == hash(DecideCmd(prefix="p", choices=("A", "B")))


def test_cancel_and_close_take_an_optional_id() -> None:
    assert CancelCmd().id is None
    assert CancelCmd(id=7).id == 7
    assert CloseCmd().id is None


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GenerateCmd(prompt=""), "empty prompt"),
        (lambda: GenerateCmd(prompt="x", n_predict=-1), 'field "n_predict" must be >= 0, got -1'),
        (lambda: DecideCmd(prefix="p", choices=()), "empty choices list"),
        (lambda: DecideCmd(prefix="p", choices=("A", "")), "empty choice at index 1"),
        (lambda: DecideCmd(choices=("A",)), "empty prompt: prefix and suffix are both empty"),
    ],
)
def test_requests_refuse_bad_values_with_the_message_the_session_sends(build: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()  # type: ignore[operator]
    assert str(info.value) == message
    assert isinstance(info.value, BmoeError | ValueError)


def test_n_predict_zero_is_allowed() -> None:
    assert GenerateCmd(prompt="x", n_predict=0).n_predict == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": "x", "n_predict": True}, 'field "n_predict" must be an integer, got boolean'),
        ({"prompt": "x", "think": 1}, 'field "think" must be a boolean, got integer'),
        ({"prompt": 3}, 'field "prompt" must be a string, got integer'),
        ({"prompt": "x", "id": 1.5}, 'field "id" must be a string or an integer, got float'),
        ({"prompt": "x", "clear_kv": None}, 'field "clear_kv" must be a boolean, got null'),
    ],
)
def test_requests_refuse_wrong_types_strictly(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        GenerateCmd(**kwargs)  # type: ignore[arg-type]


def test_requests_are_frozen() -> None:
    cmd = GenerateCmd(prompt="x")
    with pytest.raises(AttributeError):
        cmd.prompt = "y"  # type: ignore[misc]


# -- one line -------------------------------------------------------------------------------


def test_a_full_generate_line_becomes_a_generate_event() -> None:
    line = '{"cmd":"generate","id":"a1","prompt":"Hi","n_predict":8,"think":false,"clear_kv":false}'
    assert parse_request(line) == GenerateCmd(id="a1", prompt="Hi", n_predict=8, think=False, clear_kv=False)


def test_a_full_decide_line_becomes_a_decide_event() -> None:
    line = json.dumps(
        {
            "cmd": "decide",
            "id": 1,
            "prefix": "P ",
            "suffix": "S",
            "choices": ["A", "B"],
            "reuse_prefix": False,
        }
    )
    assert parse_request(line) == DecideCmd(
        id=1, prefix="P ", suffix="S", choices=("A", "B"), reuse_prefix=False
    )


def test_absent_fields_take_their_defaults_and_explicit_null_means_default_too() -> None:
    assert parse_request('{"cmd":"generate","prompt":"Hi"}') == GenerateCmd(prompt="Hi")
    assert parse_request('{"cmd":"generate","prompt":"Hi","n_predict":null,"think":null,"id":null}') == (
        GenerateCmd(prompt="Hi")
    )


def test_cancel_and_close_lines() -> None:
    assert parse_request('{"cmd":"cancel"}') == CancelCmd()
    assert parse_request('{"cmd":"cancel","id":4}') == CancelCmd(id=4)
    assert parse_request('{"cmd":"close"}') == CloseCmd()
    assert parse_request('{"cmd":"close","id":"bye"}') == CloseCmd(id="bye")


@pytest.mark.parametrize("request_id", [0, -3, 2**70, "", "req-1", "ünï"])
def test_the_id_is_carried_as_sent(request_id: object) -> None:
    event = parse_request(json.dumps({"cmd": "generate", "id": request_id, "prompt": "x"}))
    assert isinstance(event, GenerateCmd)
    assert event.id == request_id
    assert type(event.id) is type(request_id)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("hello", "not JSON: Expecting value at column 1"),
        ('{"cmd":"generate",', "not JSON: Expecting property name enclosed in double quotes at column 19"),
        ('{"cmd":"generate","prompt":"x"} x', "not JSON: Extra data at column 33"),
        ('{"cmd":"generate","prompt":"x","n_predict":NaN}', "not JSON: NaN is not a JSON value"),
        ('{"cmd":"generate","prompt":"x","n_predict":Infinity}', "not JSON: Infinity is not a JSON value"),
        ("[1, 2]", "a request must be a JSON object"),
        ('"generate"', "a request must be a JSON object"),
        ("null", "a request must be a JSON object"),
        ('{"prompt":"x"}', 'missing "cmd"'),
        ('{"cmd":5}', 'field "cmd" must be a string, got integer'),
        ('{"cmd":"generat"}', 'unknown cmd "generat" (expected one of: cancel, close, decide, generate)'),
        ('{"cmd":"generate"}', 'missing field "prompt" in generate'),
        ('{"cmd":"generate","prompt":""}', "empty prompt"),
        (
            '{"cmd":"generate","prompt":"x","n_predict":"5"}',
            'field "n_predict" must be an integer, got string',
        ),
        (
            '{"cmd":"generate","prompt":"x","n_predict":5.0}',
            'field "n_predict" must be an integer, got float',
        ),
        (
            '{"cmd":"generate","prompt":"x","n_predict":true}',
            'field "n_predict" must be an integer, got boolean',
        ),
        ('{"cmd":"generate","prompt":"x","n_predict":-1}', 'field "n_predict" must be >= 0, got -1'),
        ('{"cmd":"generate","prompt":"x","think":1}', 'field "think" must be a boolean, got integer'),
        ('{"cmd":"generate","prompt":"x","clear_kv":"no"}', 'field "clear_kv" must be a boolean, got string'),
        ('{"cmd":"generate","prompt":"x","clear_kv":null}', 'field "clear_kv" must be a boolean, got null'),
        ('{"cmd":"generate","prompt":["x"]}', 'field "prompt" must be a string, got array'),
        ('{"cmd":"generate","prompt":"x","n_predit":5}', 'unknown field "n_predit" in generate'),
        (
            '{"cmd":"generate","prompt":"x","id":true}',
            'field "id" must be a string or an integer, got boolean',
        ),
        ('{"cmd":"generate","prompt":"x","id":{}}', 'field "id" must be a string or an integer, got object'),
        ('{"cmd":"decide","prefix":"p"}', 'missing field "choices" in decide'),
        ('{"cmd":"decide","prefix":"p","choices":[]}', "empty choices list"),
        ('{"cmd":"decide","prefix":"p","choices":["A",""]}', "empty choice at index 1"),
        (
            '{"cmd":"decide","prefix":"p","choices":"AB"}',
            'field "choices" must be a list of strings, got string',
        ),
        (
            '{"cmd":"decide","prefix":"p","choices":["A",2]}',
            'field "choices" must be a list of strings, got integer at index 1',
        ),
        ('{"cmd":"decide","choices":["A"]}', "empty prompt: prefix and suffix are both empty"),
        (
            '{"cmd":"decide","prefix":"","suffix":"","choices":["A"]}',
            "empty prompt: prefix and suffix are both empty",
        ),
        ('{"cmd":"decide","suffix":"s","choices":["A"],"think":true}', 'unknown field "think" in decide'),
        (
            '{"cmd":"decide","suffix":"s","choices":["A"],"reuse_prefix":0}',
            'field "reuse_prefix" must be a boolean, got integer',
        ),
        ('{"cmd":"cancel","now":true}', 'unknown field "now" in cancel'),
        ('{"cmd":"close","force":true}', 'unknown field "force" in close'),
    ],
)
def test_a_bad_line_becomes_a_bad_request_naming_the_problem(line: str, message: str) -> None:
    assert parse_request(line) == BadRequest(None, message)


def test_every_problem_of_a_line_is_named_in_one_line() -> None:
    event = parse_request('{"cmd":"generate","n_predict":"8","promt":"Hi","zz":1}')
    assert event == BadRequest(
        None,
        'missing field "prompt" in generate; field "n_predict" must be an integer, got string; '
        'unknown field "promt" in generate; unknown field "zz" in generate',
    )


@pytest.mark.parametrize(
    "line",
    [
        '{"id":7,"prompt":"x"}',
        '{"id":7,"cmd":"generat"}',
        '{"id":7,"cmd":"generate"}',
        '{"id":7,"cmd":"generate","prompt":""}',
        '{"id":7,"cmd":"generate","prompt":"x","think":1}',
        '{"id":7,"cmd":"decide","choices":[]}',
        '{"id":7,"cmd":null}',
    ],
)
def test_a_bad_request_carries_the_id_of_the_line(line: str) -> None:
    event = parse_request(line)
    assert isinstance(event, BadRequest)
    assert event.id == 7


def test_an_id_of_the_wrong_type_is_not_echoed() -> None:
    assert parse_request('{"id":1.5,"cmd":"cancel"}') == BadRequest(
        None, 'field "id" must be a string or an integer, got float'
    )


def test_a_strange_cmd_or_key_is_quoted_escaped_and_shortened_in_the_message() -> None:
    assert parse_request('{"cmd":"a\\nb"}') == BadRequest(
        None, 'unknown cmd "a\\nb" (expected one of: cancel, close, decide, generate)'
    )
    event = parse_request(json.dumps({"cmd": "cancel", "k" * 100: 1}))
    assert event == BadRequest(None, f'unknown field "{"k" * 40}..." in cancel')


def test_a_line_that_is_not_utf8_is_a_bad_request() -> None:
    assert parse_request(b'{"cmd":"generate","prompt":"\xff"}') == BadRequest(
        None, "not UTF-8: invalid start byte at byte 29"
    )


def test_json_nested_past_the_recursion_limit_is_a_bad_request_not_a_crash() -> None:
    assert parse_request("[" * 100_000) == BadRequest(None, "not JSON: nested too deeply")


def test_an_integer_too_long_to_convert_is_a_bad_request_not_a_crash() -> None:
    event = parse_request('{"cmd":"generate","prompt":"x","n_predict":' + "9" * 5000 + "}")
    assert isinstance(event, BadRequest)
    assert event.msg.startswith("not JSON: ")


def test_a_byte_order_mark_before_the_json_is_ignored() -> None:
    assert parse_request('\ufeff{"cmd":"cancel"}'.encode()) == CancelCmd()


def test_non_ascii_text_passes_through() -> None:
    assert parse_request('{"cmd":"generate","prompt":"Grüß dich, 世界 \\n🙂"}') == GenerateCmd(
        prompt="Grüß dich, 世界 \n🙂"
    )


# -- the reader: framing, blank lines, oversize lines, end of input ------------------------


def _feed_all(chunks: list[bytes], reader: RequestReader | None = None) -> list[ReaderEvent]:
    reader = reader or RequestReader()
    events: list[ReaderEvent] = []
    for chunk in chunks:
        events += reader.feed(chunk)
    return events + reader.feed_eof()


TRANSCRIPT = (
    b'{"cmd":"generate","id":1,"prompt":"Hi \xc3\xa9\xf0\x9f\x99\x82","n_predict":4}\n'
    b"\n"
    b"   \r\n"
    b'{"cmd":"decide","id":"d","prefix":"P","suffix":"S","choices":["A","B"]}\r\n'
    b"not json\n"
    b'{"cmd":"cancel"}\n'
    b'{"cmd":"generate","id":2,"prompt":"' + b"x" * 200 + b'"}\n'
    b'{"cmd":"close","id":3}'
)
TRANSCRIPT_EVENTS: list[ReaderEvent] = [
    GenerateCmd(id=1, prompt="Hi é🙂", n_predict=4),
    DecideCmd(id="d", prefix="P", suffix="S", choices=("A", "B")),
    BadRequest(None, "not JSON: Expecting value at column 1"),
    CancelCmd(),
    BadRequest(None, "line longer than 128 bytes"),
    CloseCmd(id=3),
    EndOfInput(),
]


def test_several_lines_in_one_chunk_give_one_event_each_in_order() -> None:
    assert _feed_all([TRANSCRIPT], RequestReader(max_line_bytes=128)) == TRANSCRIPT_EVENTS


def test_feeding_byte_by_byte_gives_the_same_events_as_whole_lines() -> None:
    chunks = [TRANSCRIPT[i : i + 1] for i in range(len(TRANSCRIPT))]
    assert _feed_all(chunks, RequestReader(max_line_bytes=128)) == TRANSCRIPT_EVENTS


@given(st.lists(st.integers(min_value=0, max_value=len(TRANSCRIPT)), max_size=20))
def test_any_split_of_the_input_gives_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(TRANSCRIPT)]
    chunks = [TRANSCRIPT[a:b] for a, b in itertools.pairwise(bounds)]
    assert _feed_all(chunks, RequestReader(max_line_bytes=128)) == TRANSCRIPT_EVENTS


def test_a_partial_line_yields_nothing_until_its_newline() -> None:
    reader = RequestReader()
    assert reader.feed(b'{"cmd":"can') == []
    assert reader.feed(b'cel"}') == []
    assert reader.feed(b"\n") == [CancelCmd()]


def test_a_multibyte_character_split_across_chunks_is_reassembled() -> None:
    line = '{"cmd":"generate","prompt":"🙂"}\n'.encode()
    cut = line.index(b"\xf0") + 2
    assert _feed_all([line[:cut], line[cut:]]) == [GenerateCmd(prompt="🙂"), EndOfInput()]


def test_blank_and_whitespace_lines_are_ignored() -> None:
    assert RequestReader().feed(b"\n\r\n  \t \n\n") == []


def test_crlf_line_endings_are_tolerated() -> None:
    assert RequestReader().feed(b'{"cmd":"cancel"}\r\n{"cmd":"close"}\r\n') == [CancelCmd(), CloseCmd()]


def test_the_default_line_limit_is_one_mib() -> None:
    assert DEFAULT_MAX_LINE_BYTES == 1 << 20
    prompt = "x" * (1 << 20)
    events = RequestReader().feed(json.dumps({"cmd": "generate", "prompt": prompt}).encode() + b"\n")
    assert events == [BadRequest(None, "line longer than 1048576 bytes")]


def test_a_line_at_the_limit_is_read_and_one_byte_over_is_refused() -> None:
    at_limit = b'{"cmd":"generate","prompt":"' + b"x" * 34 + b'"}'
    assert len(at_limit) == 64
    assert RequestReader(max_line_bytes=64).feed(at_limit + b"\n") == [GenerateCmd(prompt="x" * 34)]
    over = b'{"cmd":"generate","prompt":"' + b"x" * 35 + b'"}'
    assert RequestReader(max_line_bytes=64).feed(over + b"\n") == [
        BadRequest(None, "line longer than 64 bytes")
    ]


def test_an_oversize_line_is_refused_once_as_soon_as_it_is_too_long_then_the_reader_recovers() -> None:
    reader = RequestReader(max_line_bytes=16)
    assert reader.feed(b"x" * 10) == []
    assert reader.feed(b"x" * 10) == [BadRequest(None, "line longer than 16 bytes")]
    assert reader.feed(b"x" * 1000) == []
    assert reader.feed(b'xx\n{"cmd":"close"}\n') == [CloseCmd()]


def test_end_of_input_inside_an_oversize_line_only_ends_the_input() -> None:
    reader = RequestReader(max_line_bytes=16)
    assert reader.feed(b"y" * 40) == [BadRequest(None, "line longer than 16 bytes")]
    assert reader.feed_eof() == [EndOfInput()]


def test_end_of_input_parses_a_last_line_left_without_newline() -> None:
    reader = RequestReader()
    assert reader.feed(b'{"cmd":"generate","prompt":"last"}') == []
    assert reader.feed_eof() == [GenerateCmd(prompt="last"), EndOfInput()]


def test_end_of_input_after_a_bad_partial_line_reports_it_then_ends() -> None:
    reader = RequestReader()
    reader.feed(b'{"cmd":"gen')
    assert reader.feed_eof() == [
        BadRequest(None, "not JSON: Unterminated string starting at column 8"),
        EndOfInput(),
    ]


def test_end_of_input_on_an_empty_stream_is_just_end_of_input() -> None:
    assert RequestReader().feed_eof() == [EndOfInput()]


def test_the_reader_refuses_to_be_fed_after_end_of_input() -> None:
    reader = RequestReader()
    reader.feed_eof()
    with pytest.raises(ProtocolError):
        reader.feed(b"{}\n")
    with pytest.raises(ProtocolError):
        reader.feed_eof()


def test_the_line_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_line_bytes must be >= 1"):
        RequestReader(max_line_bytes=0)


@given(st.binary(max_size=300))
def test_the_reader_never_raises_on_any_bytes(data: bytes) -> None:
    events = _feed_all([data], RequestReader(max_line_bytes=100))
    assert events[-1] == EndOfInput()
    assert all(not isinstance(e, EndOfInput) for e in events[:-1])


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
_keys = st.sampled_from(
    [
        "id",
        "cmd",
        "prompt",
        "n_predict",
        "think",
        "clear_kv",
        "prefix",
        "suffix",
        "choices",
        "reuse_prefix",
        "x",
    ]
)
_cmds = st.sampled_from(["generate", "decide", "cancel", "close", "other"])


@given(st.dictionaries(_keys, _json_values, max_size=6), _cmds)
def test_any_json_object_becomes_a_request_or_a_bad_request_never_an_exception(
    fields: dict[str, object], cmd: str
) -> None:
    for obj in (fields, {**fields, "cmd": cmd}):
        event = parse_request(json.dumps(obj))
        assert isinstance(event, GenerateCmd | DecideCmd | CancelCmd | CloseCmd | BadRequest)
        if isinstance(event, BadRequest):
            assert event.msg
            assert "\n" not in event.msg
            assert "\r" not in event.msg


_ids = st.one_of(st.none(), st.integers(), st.text())


@given(
    st.builds(
        GenerateCmd,
        id=_ids,
        prompt=st.text(min_size=1),
        n_predict=st.none() | st.integers(min_value=0),
        think=st.none() | st.booleans(),
        clear_kv=st.booleans(),
    )
    | st.builds(
        DecideCmd,
        id=_ids,
        prefix=st.text(),
        suffix=st.text(min_size=1),
        choices=st.lists(st.text(min_size=1), min_size=1).map(tuple),
        reuse_prefix=st.booleans(),
    )
    | st.builds(CancelCmd, id=_ids)
    | st.builds(CloseCmd, id=_ids)
)
def test_a_request_written_as_json_reads_back_equal_with_its_id(cmd: Request) -> None:
    obj = {"cmd": cmd.CMD, **attrs.asdict(cmd)}
    assert parse_request(json.dumps(obj).encode()) == cmd
