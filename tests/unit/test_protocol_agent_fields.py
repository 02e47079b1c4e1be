"""The line protocol's agent fields: ``generate`` with a grammar, a JSON schema, tools and
logprobs; ``BMOE_DONE`` with the calls and the log-probabilities, read back as written."""

from __future__ import annotations

import json

import attrs

from bmoe.adapters.protocol import Done, DoneLogprob, DoneToolCall, GenerateCmd
from bmoe.adapters.protocol.converter import request_from_json, response_from_json, response_to_json
from bmoe.adapters.protocol.requests import BadRequest
from bmoe.domain.constraints import OutputConstraint
from bmoe.domain.tools import ToolChoice

TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def test_generate_reads_a_grammar_a_schema_tools_and_logprobs() -> None:
    cmd = request_from_json({"cmd": "generate", "prompt": "p", "grammar": 'root ::= "a"', "logprobs": 3})
    assert isinstance(cmd, GenerateCmd)
    assert cmd.constraint() == OutputConstraint.gbnf('root ::= "a"') and cmd.logprobs == 3
    cmd = request_from_json({"cmd": "generate", "prompt": "p", "json_schema": {"type": "object"}})
    want = attrs.evolve(OutputConstraint.json_schema({"type": "object"}), field="json_schema")
    assert isinstance(cmd, GenerateCmd) and cmd.constraint() == want  # errors name the protocol's field
    cmd = request_from_json({"cmd": "generate", "prompt": "p", "tools": TOOLS, "tool_choice": "required"})
    assert isinstance(cmd, GenerateCmd)
    use = cmd.tool_use()
    assert use is not None and use.choice == ToolChoice("required") and use.tools[0].name == "weather"


def test_generate_refuses_wrong_agent_fields_naming_them() -> None:
    for fields, says in [
        ({"tools": [{"type": "nope"}]}, "tools[0]"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"logprobs": 21}, "logprobs"),
        ({"json_schema": [1]}, "json_schema"),
        ({"grammar": "root ::= x", "json_schema": {}}, "not both"),
    ]:
        bad = request_from_json({"cmd": "generate", "prompt": "p", **fields})
        assert isinstance(bad, BadRequest) and says in bad.msg, (fields, bad)


def test_done_carries_tool_calls_and_logprobs_both_ways() -> None:
    done = Done(
        id=1,
        cancelled=False,
        tokens=2,
        tok_s=1.0,
        prefill_s=0.1,
        prefill_tps=10.0,
        load_s=0.0,
        n_prompt=3,
        n_past=5,
        text="",
        tool_calls=(DoneToolCall(id="abcdefghi", name="weather", arguments='{"city": "Paris"}'),),
        logprobs=(DoneLogprob(token=7, text="a", logprob=-0.5, top=((7, -0.5), (8, -1.5))),),
    )
    line = json.loads(json.dumps(response_to_json(done)))
    assert line["tool_calls"] == [{"id": "abcdefghi", "name": "weather", "arguments": '{"city": "Paris"}'}]
    assert response_from_json("BMOE_DONE", line) == done
