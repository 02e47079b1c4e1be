"""The agent frameworks themselves, unchanged, against ``python -m bmoe.serve`` on the tiny
fixture: instructor (``JSON_SCHEMA`` and ``TOOLS``), langchain-openai
(``with_structured_output`` by JSON schema and by function calling, a tool loop) and the
OpenAI Agents SDK (``output_type``, function tools, a required tool choice beside it), over
chat completions and, with its default model, the Responses API.

Their pydantic models use what pydantic writes for real code: ``Field(ge=..., le=...)``,
``PositiveInt``, ``date``, ``Literal``, ``Enum``, nested lists of objects. The fixture's
weights are random, so what it writes is whatever the grammar lets through: each path must
come back parsed and valid. Strings and lists are bounded so that a reply fits in
``max_tokens`` on a vocabulary of one token per character.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field, PositiveInt
from test_server import Running, serving

instructor = pytest.importorskip("instructor")
agents = pytest.importorskip("agents")
langchain_openai = pytest.importorskip("langchain_openai")
openai = pytest.importorskip("openai")
agents.set_tracing_disabled(True)  # the SDK would export its traces to OpenAI

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
Short = Annotated[str, Field(max_length=6)]


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Item(BaseModel):
    name: Short
    count: int = Field(ge=1, le=9)


class Order(BaseModel):
    """What the tests ask for: bounds, a positive int, a date, a Literal, an Enum, a list."""

    quantity: PositiveInt = Field(le=99)
    score: float = Field(ge=0.0, lt=1.0)
    day: datetime.date
    kind: Literal["a", "b"]
    colour: Colour
    items: list[Item] = Field(max_length=2)


def _check(order: Order) -> None:
    assert 1 <= order.quantity <= 99 and 0.0 <= order.score < 1.0
    assert all(1 <= item.count <= 9 for item in order.items)


@pytest.fixture(scope="module")
def server(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), "-c", "2048", "--chat-template-file", str(QWEN3)) as running:
        yield running


ASK = [{"role": "user", "content": "Make an order."}]


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor_returns_a_valid_bounded_model(server: Running, mode: str) -> None:
    client = instructor.from_openai(server.client(), mode=getattr(instructor.Mode, mode))
    order = client.chat.completions.create(
        model="m", messages=ASK, response_model=Order, max_tokens=400, max_retries=0
    )
    _check(order)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output_is_a_valid_model(server: Running, method: str) -> None:
    llm = langchain_openai.ChatOpenAI(
        base_url=server.url, api_key="none", model="m", max_tokens=400, max_retries=0
    )
    order = llm.with_structured_output(Order, method=method).invoke("Make an order.")
    _check(order)


def test_langchain_streams_structured_output(server: Running) -> None:
    llm = langchain_openai.ChatOpenAI(
        base_url=server.url, api_key="none", model="m", max_tokens=400, max_retries=0, streaming=True
    )
    chunks = list(llm.with_structured_output(Order, method="json_schema").stream("Make an order."))
    _check(Order.model_validate(chunks[-1]) if isinstance(chunks[-1], dict) else chunks[-1])


def test_langchain_tool_loop_runs_the_tool_and_answers(server: Running) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def lookup(code: Annotated[str, Field(max_length=4)], n: Annotated[int, Field(ge=1, le=5)]) -> str:
        """Look a code up."""
        return f"{code}:{n}"

    llm = langchain_openai.ChatOpenAI(
        base_url=server.url, api_key="none", model="m", max_tokens=200, max_retries=0
    )
    asking = llm.bind_tools([lookup], tool_choice="required")
    messages: list[object] = [HumanMessage("Look up a code.")]
    called = asking.invoke(messages)
    assert called.tool_calls and called.tool_calls[0]["name"] == "lookup"
    args = called.tool_calls[0]["args"]
    assert len(args["code"]) <= 4 and 1 <= args["n"] <= 5
    messages += [called, ToolMessage(lookup.invoke(args), tool_call_id=called.tool_calls[0]["id"])]
    answer = llm.bind_tools([lookup]).invoke(messages)
    assert isinstance(answer.content, str)


def _agent_model(server: Running, api: str = "chat") -> object:
    client = openai.AsyncOpenAI(base_url=server.url, api_key="none")
    if api == "responses":  # the SDK's default model: the Responses API
        return agents.OpenAIResponsesModel(model="m", openai_client=client)
    return agents.OpenAIChatCompletionsModel(model="m", openai_client=client)


def _stock_agent(server: Running, api: str = "chat") -> tuple[object, list[int]]:
    """An agent with a bounded function tool, ``output_type`` and a required tool choice;
    the arguments its tool was called with."""
    ran: list[int] = []

    @agents.function_tool
    def stock(n: Annotated[int, Field(ge=1, le=5)]) -> str:
        """How many are in stock."""
        ran.append(n)
        return str(n * 2)

    agent = agents.Agent(
        name="orders",
        instructions="Check the stock, then make an order.",
        model=_agent_model(server, api),
        tools=[stock],
        output_type=Order,
        model_settings=agents.ModelSettings(max_tokens=400, tool_choice="required"),
    )
    return agent, ran


def test_agents_sdk_output_type_is_a_valid_model(server: Running) -> None:
    agent = agents.Agent(
        name="orders",
        instructions="Make an order.",
        model=_agent_model(server),
        output_type=Order,
        model_settings=agents.ModelSettings(max_tokens=400),
    )
    result = asyncio.run(agents.Runner.run(agent, "Make an order."))
    _check(result.final_output)


def test_agents_sdk_required_tool_then_output_type(server: Running) -> None:
    """Tools, ``output_type`` and a required tool choice: the first turn must call (the
    response format waits), the SDK then resets the choice and the run ends in an Order."""
    agent, ran = _stock_agent(server)
    result = asyncio.run(agents.Runner.run(agent, "Make an order.", max_turns=6))
    assert ran and all(1 <= n <= 5 for n in ran)
    _check(result.final_output)


def test_a_set_field_is_refused_naming_its_pointer_and_the_framework_raises_it(server: Running) -> None:
    class Tags(BaseModel):
        tags: set[Short]

    client = instructor.from_openai(server.client(), mode=instructor.Mode.JSON_SCHEMA)
    with pytest.raises(Exception) as info:  # instructor wraps the client's error in its own
        client.chat.completions.create(
            model="m", messages=ASK, response_model=Tags, max_tokens=50, max_retries=0
        )
    error: BaseException | None = info.value
    while error is not None and not isinstance(error, openai.BadRequestError):
        error = error.__cause__ or error.__context__
    assert isinstance(error, openai.BadRequestError), info.value
    assert error.body["code"] == "invalid_grammar"  # type: ignore[index]
    assert error.body["param"].endswith("#/properties/tags/uniqueItems")  # type: ignore[index]


def test_instructor_streams_partial_models_ending_valid(server: Running) -> None:
    client = instructor.from_openai(server.client(), mode=instructor.Mode.JSON_SCHEMA)
    partials = list(
        client.chat.completions.create_partial(
            model="m", messages=ASK, response_model=Order, max_tokens=400, max_retries=0, strict=False
        )
    )
    assert len(partials) > 1  # it streamed
    _check(Order.model_validate(partials[-1].model_dump()))


def test_agents_sdk_streamed_run_with_a_required_tool_ends_in_a_valid_model(server: Running) -> None:
    agent, ran = _stock_agent(server)

    async def run() -> object:
        result = agents.Runner.run_streamed(agent, "Make an order.", max_turns=6)
        events = [event async for event in result.stream_events()]
        assert events
        return result.final_output

    final = asyncio.run(run())
    assert ran and all(1 <= n <= 5 for n in ran)
    assert isinstance(final, Order)
    _check(final)


def test_agents_sdk_default_responses_model_output_type_and_a_required_tool(server: Running) -> None:
    """The SDK's default model speaks the Responses API: ``text.format`` for the output
    type, a function tool, ``function_call_output`` items back; run and streamed."""
    plain = agents.Agent(
        name="orders",
        instructions="Make an order.",
        model=_agent_model(server, "responses"),
        output_type=Order,
        model_settings=agents.ModelSettings(max_tokens=400),
    )
    _check(asyncio.run(agents.Runner.run(plain, "Make an order.")).final_output)
    agent, ran = _stock_agent(server, "responses")
    result = asyncio.run(agents.Runner.run(agent, "Make an order.", max_turns=6))
    assert ran and all(1 <= n <= 5 for n in ran)
    _check(result.final_output)

    async def run() -> object:
        streamed = agents.Runner.run_streamed(agent, "Make an order.", max_turns=6)
        assert [event async for event in streamed.stream_events()]
        return streamed.final_output

    final = asyncio.run(run())
    assert isinstance(final, Order)
    _check(final)
