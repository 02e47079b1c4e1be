"""The coding agents ``python -m bmoe.launch`` starts, and how each is pointed at a server:
the environment it runs with where it is installed, the configuration to paste where not.

- Claude Code (``claude``) speaks Anthropic's Messages API: ``ANTHROPIC_BASE_URL`` (the
  server, no ``/v1``), ``ANTHROPIC_AUTH_TOKEN`` (the key, sent as a bearer token),
  ``ANTHROPIC_MODEL`` and the small model for its side requests (the same model).
- Codex CLI (``codex``) speaks OpenAI's Responses API through a provider of its
  ``~/.codex/config.toml`` with ``wire_api = "responses"``; launched, it gets the same
  provider and profile as ``-c`` overrides, its key in ``BMOE_API_KEY``.
- opencode (``opencode``) takes a provider on ``@ai-sdk/openai-compatible`` (chat
  completions) from the file ``OPENCODE_CONFIG`` names.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from bmoe.adapters.file_writes import write_file

KEY_VARIABLE = "BMOE_API_KEY"  # Codex's env_key: the variable its provider reads the key from
PROVIDER = "bmoe"


@attrs.frozen
class Target:
    """The server an agent is pointed at: its address (``http://HOST:PORT``), key and model id."""

    url: str
    key: str
    model: str


def codex_toml(t: Target) -> str:
    return (
        f"[model_providers.{PROVIDER}]\n"
        f'name = "bmoe"\n'
        f'base_url = "{t.url}/v1"\n'
        f'env_key = "{KEY_VARIABLE}"\n'
        f'wire_api = "responses"\n'
        f"\n[profiles.{PROVIDER}]\n"
        f'model_provider = "{PROVIDER}"\n'
        f'model = "{t.model}"\n'
    )


def opencode_config(t: Target) -> dict[str, object]:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "bmoe",
                "options": {"baseURL": f"{t.url}/v1", "apiKey": t.key},
                "models": {t.model: {"name": t.model}},
            }
        },
        "model": f"{PROVIDER}/{t.model}",
    }


def claude_env(t: Target) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": t.url,
        "ANTHROPIC_AUTH_TOKEN": t.key,
        "ANTHROPIC_MODEL": t.model,
        "ANTHROPIC_SMALL_FAST_MODEL": t.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": t.model,
    }


@attrs.frozen
class Launch:
    """How to run one client: its argv after the executable, its environment's additions."""

    args: tuple[str, ...]
    env: dict[str, str]


def launch(client: str, t: Target, state: Path) -> Launch:
    """The client's arguments and environment (``state``: a folder for its config file)."""
    if client == "claude":
        return Launch((), claude_env(t))
    if client == "codex":
        provider = f'{{name="bmoe", base_url="{t.url}/v1", env_key="{KEY_VARIABLE}", wire_api="responses"}}'
        args = ("-c", f"model_providers.{PROVIDER}={provider}", "-c", f'model_provider="{PROVIDER}"')
        env = {KEY_VARIABLE: t.key, "OPENAI_BASE_URL": f"{t.url}/v1"}
        return Launch((*args, "-c", f'model="{t.model}"'), env)
    if client == "opencode":
        path = write_file(
            state / "opencode.json", json.dumps(opencode_config(t), indent=2) + "\n", "opencode's config"
        )
        return Launch((), {"OPENCODE_CONFIG": str(path)})
    raise ValueError(f"unknown client {client!r}")


def paste(client: str, t: Target) -> str:
    """The configuration to paste for a client that is not installed here, with where it goes."""
    if client == "claude":
        lines = "\n".join(f"export {k}={v}" for k, v in claude_env(t).items())
        return f"# Claude Code: set these in the shell, then run `claude`\n{lines}\n"
    if client == "codex":
        return (
            "# Codex CLI: add to ~/.codex/config.toml, then run "
            f"`{KEY_VARIABLE}={t.key} codex --profile {PROVIDER}`\n{codex_toml(t)}"
        )
    if client == "opencode":
        doc = json.dumps(opencode_config(t), indent=2)
        where = "save as opencode.json in the project (or OPENCODE_CONFIG=FILE), then run `opencode`"
        return f"# opencode: {where}\n{doc}\n"
    raise ValueError(f"unknown client {client!r}")


CLIENTS = ("claude", "codex", "opencode")
