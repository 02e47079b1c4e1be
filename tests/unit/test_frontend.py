"""The two commands share one front end (``bmoe.frontend``): every flag both parsers define
opens the same session through either command, and sets the same sampling. The flags are
enumerated from the parsers, so a flag added to both is checked without editing this test."""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs
import pytest

from bmoe import cli
from bmoe.errors import BmoeError
from bmoe.frontend.configs import resolve_model, sampling_params
from bmoe.frontend.flags import cache_mb
from bmoe.runtime import SessionConfig
from bmoe.serve import flags as serve_flags

# Values for the flags that take free text, where any text would not do (an address, a
# device name); every other flag's value is made from its type, choices and default.
TEXT_VALUES = {
    "--rpc": "127.0.0.1:50052",
    "--device": "CUDA0",
    "--profile": "off",
    "--route-trace": "rt.csv",
    "--io-trace": "io.csv",
    "--hf-repo": "user/repo",
    "--hf-file": "model.gguf",
}
# The test names its model with -m, which -hf excludes (and -hff needs -hf): those two flags
# end in the same refusal through both commands, and only there.
REFUSED_WITH_M = {"hf_repo", "hf_file"}
# Each flag is tried alone, with the switches most others need on, and with layers to place.
CONTEXTS = ([], ["--moe-stream", "--decide"], ["-ngl", "1"])


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


CLI = _actions(cli.build_parser())
SERVER = _actions(serve_flags.build_parser())
SHARED = sorted(CLI.keys() & SERVER.keys())


def _non_default(action: argparse.Action, file: Path) -> list[str]:
    """The flag with a value other than its default."""
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:
        return [flag]
    if flag in TEXT_VALUES:
        return [flag, TEXT_VALUES[flag]]
    if action.choices is not None:
        return [flag, next(str(c) for c in action.choices if c != action.default)]
    if action.type is int:
        return [flag, str((action.default or 0) + 1)]
    if action.type is float:
        return [flag, str((action.default or 0.0) * 0.5 + 0.125)]
    if action.type is cache_mb:
        return [flag, "7"]
    if action.type is Path:
        return [flag, str(file)]
    return [flag, "x"]


def _cli_config(argv: list[str]) -> SessionConfig | str:
    try:
        return cli._config(cli.build_parser().parse_args([*argv, "--chatml"]))
    except BmoeError as exc:
        return f"refused: {exc}"


def _server_config(argv: list[str]) -> SessionConfig | str:
    args = serve_flags.build_parser().parse_args(argv)
    try:
        return serve_flags.session_config(args, resolve_model(args, "bmoe.serve"))
    except BmoeError as exc:
        return f"refused: {exc}"


def test_the_parsers_share_the_flags_that_open_a_session() -> None:
    assert len(SHARED) > 50, "the enumeration finds almost nothing: it is broken, not the parsers"
    for dest in SHARED:
        assert CLI[dest].option_strings == SERVER[dest].option_strings, dest
        assert CLI[dest].default == SERVER[dest].default, dest


@pytest.mark.parametrize("dest", SHARED)
def test_a_shared_flag_opens_the_same_session_through_either_command(dest: str, tmp_path: Path) -> None:
    file = tmp_path / "template.jinja"
    file.write_text("{{ messages[0].content }}", encoding="utf-8")
    outcomes = []
    for context in CONTEXTS:
        argv = ["-m", str(tmp_path / "model.gguf"), *context, *_non_default(CLI[dest], file)]
        theirs, ours = _cli_config(argv), _server_config(argv)
        if isinstance(theirs, SessionConfig) and isinstance(ours, SessionConfig):
            # what is the commands' own: the CLI's -n; the server renders chats always
            assert ours.chat and theirs.chat
            theirs = attrs.evolve(theirs, n_predict=ours.n_predict)
        assert ours == theirs, argv
        cli_args = cli.build_parser().parse_args(argv)
        assert serve_flags.serve_defaults(serve_flags.build_parser().parse_args(argv)).sampling == (
            sampling_params(cli_args)
        )
        outcomes.append(ours)
    opened = any(isinstance(o, SessionConfig) for o in outcomes)
    assert opened == (dest not in REFUSED_WITH_M), outcomes
