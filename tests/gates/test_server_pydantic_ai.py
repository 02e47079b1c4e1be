"""pydantic-ai, unchanged, against the server on the tiny fixture, with its OpenAI Responses
model and its Anthropic model: a structured output (native: ``text.format`` /
``output_config.format``) and a function tool beside a tool output (a required call).

The fixture's weights are random: what it writes is whatever the grammar lets through, so
each run must end parsed and valid."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field
from test_server import Running, serving

pydantic_ai = pytest.importorskip("pydantic_ai")
from pydantic_ai.models.anthropic import AnthropicModel  # noqa: E402
from pydantic_ai.models.openai import OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.anthropic import AnthropicProvider  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402

TinyModelPath = Callable[..., Path]
QWEN3 = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"


class Order(BaseModel):
    """No numeric bounds: for Anthropic the client sends a schema without them (its
    structured outputs' subset), and the random weights would write any integer."""

    kind: Literal["a", "b"]
    size: Literal[1, 2, 3]
    rush: bool


@pytest.fixture(scope="module")
def server(tiny_model_path: TinyModelPath) -> Iterator[Running]:
    with serving(tiny_model_path("qwen3moe"), "-c", "2048", "--chat-template-file", str(QWEN3)) as running:
        yield running


def model_of(server: Running, api: str) -> object:
    if api == "responses":
        return OpenAIResponsesModel("m", provider=OpenAIProvider(base_url=server.url, api_key="none"))
    base = server.url.removesuffix("/v1")  # a Claude name: pydantic-ai's profile for it sends output_config
    return AnthropicModel("claude-sonnet-4-5", provider=AnthropicProvider(base_url=base, api_key="none"))


SETTINGS = {"max_tokens": 400, "parallel_tool_calls": False}


@pytest.mark.parametrize("api", ["responses", "anthropic"])
def test_a_native_structured_output_is_a_valid_model(server: Running, api: str) -> None:
    agent = pydantic_ai.Agent(model_of(server, api), output_type=pydantic_ai.NativeOutput(Order))
    result = agent.run_sync("Make an order.", model_settings=SETTINGS)  # type: ignore[arg-type]
    assert isinstance(result.output, Order)


@pytest.mark.parametrize("api", ["responses", "anthropic"])
def test_a_function_tool_beside_a_tool_output(server: Running, api: str) -> None:
    ran: list[int] = []
    agent = pydantic_ai.Agent(model_of(server, api), output_type=Order)

    async def once(_ctx: object, tool: ToolDefinition) -> ToolDefinition | None:
        return None if ran else tool  # called once, then only the output tool is left to call

    @agent.tool_plain(prepare=once)  # type: ignore[arg-type]
    def stock(n: Annotated[int, Field(ge=1, le=5)]) -> str:
        """How many are in stock."""
        ran.append(n)
        return str(n * 2)

    result = agent.run_sync("Check the stock, then make an order.", model_settings=SETTINGS)  # type: ignore[arg-type]
    assert isinstance(result.output, Order)
    assert len(ran) == 1 and 1 <= ran[0] <= 5
    assert result.usage.requests == 2  # the tool's call, then the output's
