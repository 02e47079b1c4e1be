"""The response side of the session protocol: events in, BMOE_* lines out, and back."""

from __future__ import annotations

import json
import math

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bmoe.adapters.protocol import (
    NOT_MEASURED,
    Begin,
    DecideDone,
    Done,
    Error,
    Progress,
    ProgressBudgetChange,
    ProtocolError,
    Ready,
    Response,
    ResponseReader,
    encode_response,
    parse_response,
)
from bmoe.errors import BmoeError

READY = Ready(
    load_s=12.5, arch="qwen3moe", n_ctx=4096, n_expert_used=8, think_ctl=True, repacked=True,
    weights="weights repacked by llama.cpp at load (CPU_REPACK 1.5 MiB)",
)  # fmt: skip
BEGIN = Begin(id=1)
PROGRESS = Progress(
    step=3,
    steps=32,
    wall_ms=190.5,
    io_ms=60.25,
    compute_ms=120.0,
    mgmt_ms=10.25,
    stall_ms=0.0,
    read_mb=236.5,
    cache_hit_pct=76.0,
    delta_text="é",
    delta_reasoning="",
    cache_resident_mib=250.0,
    cache_budget_mib=256.0,
    budget_changes=(ProgressBudgetChange(from_mib=400.0, to_mib=256.0, why="shrink: 100 MiB free"),),
)
DONE = Done(
    id="a",
    cancelled=False,
    tokens=48,
    tok_s=5.25,
    prefill_s=1.5,
    prefill_tps=40.0,
    load_s=12.5,
    n_prompt=60,
    n_past=108,
    cache_hit_pct=76.0,
    read_mib=10822.0,
    io_s_tok=0.0625,
    compute_s_tok=0.125,
    mgmt_s_tok=0.0078125,
    stall_s_tok=0.0,
    cache_resident_mib=3998.0,
    cache_budget_mib=4000.0,
    prefill_read_mib=512.0,
    prefill_io_s=0.75,
    prefill_stall_s=0.25,
    text='Hi\n"there"',
    reasoning="hm",
)
DECIDE = DecideDone(
    id=1,
    cancelled=False,
    best=0,
    choice_logp=(-0.015625, -6.75, -math.inf),
    n_tokens=69,
    n_reused=31,
    n_prefilled=38,
    restore_s=0.0078125,
    store_s=0.03125,
    prefill_s=8.125,
    prefill_tps=4.6875,
    prefill_read_mib=-1.0,
    prefill_io_s=-1.0,
    prefill_stall_s=-1.0,
    prefix_state_mib=63.0,
    choice_p_renorm=(0.75, 0.25, 0.0),
)
ERROR = Error(
    id=None, fatal=False, msg='unknown cmd "generat" (expected one of: cancel, close, decide, generate)'
)

EXPECTED_LINES = {
    READY: (
        b'BMOE_READY {"load_s":12.5,"arch":"qwen3moe","n_ctx":4096,"n_expert_used":8,"think_ctl":true,'
        b'"repacked":true,"weights":"weights repacked by llama.cpp at load (CPU_REPACK 1.5 MiB)",'
        b'"placement":""}\n'
    ),
    BEGIN: b'BMOE_BEGIN {"id":1}\n',
    PROGRESS: (
        b'BMOE_PROGRESS {"step":3,"steps":32,"wall_ms":190.5,"io_ms":60.25,"compute_ms":120.0,'
        b'"mgmt_ms":10.25,"stall_ms":0.0,"read_mb":236.5,"cache_hit_pct":76.0,"delta_text":"\xc3\xa9","delta_reasoning":"",'
        b'"cache_resident_mib":250.0,"cache_budget_mib":256.0,'
        b'"budget_changes":[{"from_mib":400.0,"to_mib":256.0,"why":"shrink: 100 MiB free"}]}\n'
    ),
    DONE: (
        b'BMOE_DONE {"id":"a","cancelled":false,"tokens":48,"tok_s":5.25,"prefill_s":1.5,"prefill_tps":40.0,'
        b'"load_s":12.5,"n_prompt":60,"n_past":108,"n_restored":0,"cache_hit_pct":76.0,"read_mib":10822.0,"io_s_tok":0.0625,'
        b'"compute_s_tok":0.125,"mgmt_s_tok":0.0078125,"stall_s_tok":0.0,"cache_resident_mib":3998.0,'
        b'"cache_budget_mib":4000.0,"prefill_read_mib":512.0,"prefill_io_s":0.75,"prefill_stall_s":0.25,"text":"Hi\\n\\"there\\"",'
        b'"reasoning":"hm","tool_calls":[],"logprobs":[]}\n'
    ),
    DECIDE: (
        b'BMOE_DECIDE {"id":1,"cancelled":false,"best":0,"choice_logp":[-0.015625,-6.75,null],"n_tokens":69,'
        b'"n_reused":31,"n_prefilled":38,"restore_s":0.0078125,"store_s":0.03125,"prefill_s":8.125,'
        b'"prefill_tps":4.6875,"prefill_read_mib":-1.0,"prefill_io_s":-1.0,"prefill_stall_s":-1.0,"prefix_state_mib":63.0,'
        b'"choice_p_renorm":[0.75,0.25,0.0],"prefix_plan":""}\n'
    ),
    ERROR: (
        b'BMOE_ERROR {"id":null,"fatal":false,'
        b'"msg":"unknown cmd \\"generat\\" (expected one of: cancel, close, decide, generate)"}\n'
    ),
}

# The keys of docs/protocol.md, in its order: the contract (choice_p_renorm, BMOE_PROGRESS's
# cache_*_mib and budget_changes: keys bmoe adds).
PROTOCOL_KEYS = {
    "BMOE_READY": "load_s arch n_ctx n_expert_used think_ctl repacked weights placement",
    "BMOE_BEGIN": "id",
    "BMOE_PROGRESS": """step steps wall_ms io_ms compute_ms mgmt_ms stall_ms read_mb cache_hit_pct
        delta_text delta_reasoning cache_resident_mib cache_budget_mib budget_changes""",
    "BMOE_DONE": """id cancelled tokens tok_s prefill_s prefill_tps load_s n_prompt n_past n_restored
        cache_hit_pct read_mib io_s_tok compute_s_tok mgmt_s_tok stall_s_tok cache_resident_mib
        cache_budget_mib prefill_read_mib prefill_io_s prefill_stall_s text reasoning tool_calls logprobs""",
    "BMOE_DECIDE": """id cancelled best choice_logp n_tokens n_reused n_prefilled restore_s store_s prefill_s
        prefill_tps prefill_read_mib prefill_io_s prefill_stall_s prefix_state_mib choice_p_renorm
        prefix_plan""",
    "BMOE_ERROR": "id fatal msg",
}


# -- the classes -----------------------------------------------------------------------------


@pytest.mark.parametrize("event", list(EXPECTED_LINES), ids=lambda e: type(e).__name__)
def test_each_response_writes_exactly_the_protocols_keys_in_its_order(event: Response) -> None:
    tag, _, body = encode_response(event).decode().partition(" ")
    assert list(json.loads(body)) == PROTOCOL_KEYS[tag].split()


def test_figures_that_are_not_measured_default_to_minus_one() -> None:
    progress = Progress(step=1, steps=8, wall_ms=3.0)
    assert NOT_MEASURED == -1
    measured = ("io_ms", "compute_ms", "mgmt_ms", "stall_ms", "read_mb", "cache_hit_pct")
    assert all(getattr(progress, name) == -1 for name in measured)
    assert (progress.delta_text, progress.delta_reasoning) == ("", "")
    done = Done(
        id=1,
        cancelled=True,
        tokens=0,
        tok_s=0,
        prefill_s=0,
        prefill_tps=0,
        load_s=1,
        n_prompt=3,
        n_past=3,
        text="",
    )
    streaming = (
        "cache_hit_pct",
        "read_mib",
        "io_s_tok",
        "compute_s_tok",
        "mgmt_s_tok",
        "stall_s_tok",
        "cache_resident_mib",
        "cache_budget_mib",
        "prefill_read_mib",
        "prefill_io_s",
        "prefill_stall_s",
    )
    assert all(getattr(done, name) == -1 for name in streaming)
    assert done.reasoning == ""


def test_numbers_of_any_numeric_type_are_stored_as_plain_python_numbers() -> None:
    progress = Progress(step=np.int64(2), steps=8, wall_ms=np.float32(1.5), read_mb=3)
    assert type(progress.step) is int
    assert type(progress.wall_ms) is float
    assert type(progress.read_mb) is float
    assert encode_response(progress).startswith(b'BMOE_PROGRESS {"step":2,"steps":8,"wall_ms":1.5,')


def test_decide_choice_logp_is_stored_as_a_tuple_so_events_hash() -> None:
    event = attrs.evolve(DECIDE, choice_logp=[-1.0, np.float32(-2.0)])
    assert event.choice_logp == (-1.0, -2.0)
    assert hash(event) == hash(attrs.evolve(DECIDE, choice_logp=(-1.0, -2.0)))


@pytest.mark.parametrize(
    "build",
    [
        lambda: Progress(step=True, steps=1, wall_ms=1.0),
        lambda: Progress(step=1.0, steps=1, wall_ms=1.0),  # type: ignore[arg-type]
        lambda: Progress(step=1, steps=1, wall_ms="1"),  # type: ignore[arg-type]
        lambda: Progress(step=1, steps=1, wall_ms=False),
        lambda: Begin(id=1.5),  # type: ignore[arg-type]
        lambda: Error(id=None, fatal=0, msg="x"),  # type: ignore[arg-type]
        lambda: Error(id=None, fatal=False, msg=None),  # type: ignore[arg-type]
        lambda: attrs.evolve(DECIDE, choice_logp="ab"),  # type: ignore[arg-type]
    ],
)
def test_responses_refuse_wrong_types_when_built(build: object) -> None:
    with pytest.raises(TypeError):
        build()  # type: ignore[operator]


# -- writing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("event", "line"), list(EXPECTED_LINES.items()), ids=lambda x: type(x).__name__)
def test_encode_writes_the_tag_a_space_compact_json_and_a_newline(event: Response, line: bytes) -> None:
    assert encode_response(event) == line


def test_a_choice_with_log_probability_minus_infinity_is_written_as_null() -> None:
    assert b'"choice_logp":[-0.015625,-6.75,null]' in encode_response(DECIDE)


def test_non_finite_floats_are_written_as_null_and_read_back_as_nan() -> None:
    done = attrs.evolve(DONE, tok_s=math.inf, prefill_tps=math.nan)
    line = encode_response(done)
    assert b'"tok_s":null,' in line
    assert b'"prefill_tps":null,' in line
    back = parse_response(line)
    assert isinstance(back, Done)
    assert math.isnan(back.tok_s)
    assert math.isnan(back.prefill_tps)


@pytest.mark.parametrize(
    "text", ["a\nb", "a\rb", "a\r\nb", "a\x85b", "a\u2028b", "a\u2029b", "a\x0bb\x0cc\x1cd"]
)
def test_a_line_holds_no_raw_line_break_whatever_the_text(text: str) -> None:
    line = encode_response(attrs.evolve(DONE, text=text, reasoning=text))
    assert line.endswith(b"\n")
    assert len(line.decode().splitlines()) == 1
    back = parse_response(line)
    assert isinstance(back, Done)
    assert (back.text, back.reasoning) == (text, text)


def test_non_ascii_text_is_written_as_utf8_not_escaped() -> None:
    assert '"text":"Grüß 世界 🙂"'.encode() in encode_response(attrs.evolve(DONE, text="Grüß 世界 🙂"))


def test_a_lone_surrogate_is_written_as_a_json_escape_and_reads_back() -> None:
    line = encode_response(attrs.evolve(PROGRESS, delta_text="a\udcff"))
    assert b'"delta_text":"a\\udcff"' in line
    back = parse_response(line)
    assert isinstance(back, Progress)
    assert back.delta_text == "a\udcff"


# -- reading (a client's side) ---------------------------------------------------------------


def test_every_example_line_reads_back_as_its_event() -> None:
    stream = b"".join(EXPECTED_LINES.values())
    expected = [
        attrs.evolve(DECIDE, choice_logp=(-0.015625, -6.75, None)) if e is DECIDE else e
        for e in EXPECTED_LINES
    ]
    assert ResponseReader().feed(stream) == expected


def test_reading_byte_by_byte_gives_the_same_events() -> None:
    stream = b"".join(EXPECTED_LINES.values())
    reader = ResponseReader()
    events: list[Response] = []
    for i in range(len(stream)):
        events += reader.feed(stream[i : i + 1])
    assert events == ResponseReader().feed(stream)


def test_a_last_line_without_newline_is_read_at_end_of_output() -> None:
    reader = ResponseReader()
    assert reader.feed(b'BMOE_BEGIN {"id":"x"}') == []
    assert reader.feed_eof() == [Begin(id="x")]


def test_blank_lines_and_crlf_are_tolerated() -> None:
    assert ResponseReader().feed(b'\r\n\nBMOE_BEGIN {"id":2}\r\n') == [Begin(id=2)]


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    line = b'BMOE_BEGIN {"id":1,"prefill_dev_tokens":12,"extra":{"a":[1]}}\n'
    assert parse_response(line) == Begin(id=1)


def test_an_integer_where_a_float_is_expected_is_read_as_a_float() -> None:
    back = parse_response(
        b'BMOE_READY {"load_s":12,"arch":"x","n_ctx":8,"n_expert_used":2,"think_ctl":false}'
    )
    assert isinstance(back, Ready)
    assert type(back.load_s) is float


def test_absent_unmeasured_figures_read_back_as_minus_one() -> None:
    back = parse_response(b'BMOE_PROGRESS {"step":1,"steps":2,"wall_ms":3.5,"delta_text":"a"}')
    assert back == Progress(step=1, steps=2, wall_ms=3.5, delta_text="a")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'BMOE_NOPE {"id":1}', 'unknown tag "BMOE_NOPE"'),
        (b"hello world", 'unknown tag "hello"'),
        (b"BMOE_BEGIN", "not JSON after BMOE_BEGIN"),
        (b"BMOE_BEGIN {id:1}", "not JSON after BMOE_BEGIN"),
        (b"BMOE_BEGIN [1]", "BMOE_BEGIN must carry a JSON object, got array"),
        (b"BMOE_BEGIN {}", 'missing field "id" in BMOE_BEGIN'),
        (b'BMOE_ERROR {"id":1,"fatal":1,"msg":"x"}', 'field "fatal" must be a boolean, got integer'),
        (b'BMOE_PROGRESS {"step":1.0,"steps":2,"wall_ms":3}', 'field "step" must be an integer, got float'),
        (b'BMOE_BEGIN {"id":"\xff"}', "not UTF-8: invalid start byte at byte 19"),
        (
            b'BMOE_READY {"load_s":1'
            + b"0" * 400
            + b',"arch":"x","n_ctx":8,"n_expert_used":2,"think_ctl":false}',
            'field "load_s" must be a number, got an integer too large for a float',
        ),
    ],
)
def test_a_bad_response_line_raises_a_protocol_error_naming_the_problem_and_the_line(
    line: bytes, message: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        ResponseReader().feed(line + b"\n")
    assert message in str(info.value)
    try:
        shown = repr(line.decode()[:20])
    except UnicodeDecodeError:
        shown = repr(line[:20])
    assert "in line " + shown[:-1] in str(info.value)


def test_after_a_bad_line_the_events_around_it_come_from_the_next_call() -> None:
    reader = ResponseReader()
    with pytest.raises(ProtocolError):
        reader.feed(b'BMOE_BEGIN {"id":1}\nBMOE_NOPE {}\nBMOE_BEGIN {"id":2}\nBMOE_BEG')
    assert reader.feed(b"") == [Begin(id=1), Begin(id=2)]
    assert reader.feed(b'IN {"id":3}\n') == [Begin(id=3)]


def test_protocol_errors_are_bmoe_errors_and_value_errors() -> None:
    assert issubclass(ProtocolError, BmoeError)
    assert issubclass(ProtocolError, ValueError)


def test_a_long_bad_line_is_quoted_shortened() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_response("BMOE_NOPE " + "x" * 10_000)
    assert len(str(info.value)) < 400


def test_the_response_reader_refuses_to_be_fed_after_end_of_output() -> None:
    reader = ResponseReader()
    reader.feed_eof()
    with pytest.raises(ProtocolError):
        reader.feed(b"")


# -- the round trip --------------------------------------------------------------------------

# Text as the engine makes it, including the low surrogates U+DC80..U+DCFF that Python's
# "surrogateescape" makes of bytes that are not UTF-8.
_texts = st.text(
    st.one_of(st.characters(), st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF, categories=["Cs"]))
)
_ids = st.one_of(st.none(), st.integers(), _texts)
_finite = st.floats(allow_nan=False, allow_infinity=False)
_counts = st.integers(min_value=-(2**63), max_value=2**63)
_logps = st.one_of(st.none(), _finite, st.just(-math.inf), st.just(math.inf), st.just(math.nan))

_responses: st.SearchStrategy[Response] = st.one_of(
    st.builds(
        Ready, load_s=_finite, arch=_texts, n_ctx=_counts, n_expert_used=_counts, think_ctl=st.booleans()
    ),
    st.builds(Begin, id=_ids),
    st.builds(
        Progress,
        step=_counts,
        steps=_counts,
        wall_ms=_finite,
        io_ms=_finite,
        compute_ms=_finite,
        mgmt_ms=_finite,
        stall_ms=_finite,
        read_mb=_finite,
        cache_hit_pct=_finite,
        delta_text=_texts,
        delta_reasoning=_texts,
    ),
    st.builds(
        Done,
        id=_ids,
        cancelled=st.booleans(),
        tokens=_counts,
        tok_s=_finite,
        prefill_s=_finite,
        prefill_tps=_finite,
        load_s=_finite,
        n_prompt=_counts,
        n_past=_counts,
        cache_hit_pct=_finite,
        read_mib=_finite,
        io_s_tok=_finite,
        compute_s_tok=_finite,
        mgmt_s_tok=_finite,
        stall_s_tok=_finite,
        cache_resident_mib=_finite,
        cache_budget_mib=_finite,
        prefill_read_mib=_finite,
        prefill_io_s=_finite,
        text=_texts,
        reasoning=_texts,
    ),
    st.builds(
        DecideDone,
        id=_ids,
        cancelled=st.booleans(),
        best=_counts,
        choice_logp=st.lists(_logps).map(tuple),
        n_tokens=_counts,
        n_reused=_counts,
        n_prefilled=_counts,
        restore_s=_finite,
        store_s=_finite,
        prefill_s=_finite,
        prefill_tps=_finite,
        prefill_read_mib=_finite,
        prefill_io_s=_finite,
        prefix_state_mib=_finite,
    ),
    st.builds(Error, id=_ids, fatal=st.booleans(), msg=_texts),
)


def _as_read_back(event: Response) -> Response:
    """What a client reads for ``event``: a non-finite log-probability comes back as None."""
    if isinstance(event, DecideDone):
        logps = tuple(v if v is not None and math.isfinite(v) else None for v in event.choice_logp)
        return attrs.evolve(event, choice_logp=logps)
    return event


@given(st.lists(_responses, max_size=5), st.integers(min_value=1, max_value=64))
def test_encode_then_read_gives_equal_events(events: list[Response], chunk: int) -> None:
    stream = b"".join(encode_response(e) for e in events)
    assert stream.count(b"\n") == len(events)
    reader = ResponseReader()
    back: list[Response] = []
    for i in range(0, len(stream), chunk):
        back += reader.feed(stream[i : i + chunk])
    back += reader.feed_eof()
    assert back == [_as_read_back(e) for e in events]
