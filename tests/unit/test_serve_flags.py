"""The server's flags open the session the CLI's same flags open (no drift), and the
server's own flags and defaults (no model)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from bmoe import cli
from bmoe.domain.sampling import SamplingParams
from bmoe.frontend.configs import sampling_params
from bmoe.requests.mapping import ServeDefaults
from bmoe.serve.flags import build_parser, model_id, serve_defaults, session_config

MODEL = Path("/models/big-moe.gguf")

SHARED = [
    [],
    ["-t", "8", "-c", "4096", "-b", "256", "--no-think", "--verbose", "--n-expert-used", "1"],
    ["--moe-stream", "--cache-mb", "4000", "--cache-ceil-mb", "9000", "--io-threads", "8", "--no-odirect"],
    ["--moe-stream", "--cache-mb", "auto", "--stream-policy", "reference"],
    ["--decide", "--decide-prefix-cache", "off", "--decide-prefix-slots", "3"],
]


@pytest.mark.parametrize("flags", SHARED, ids=lambda f: " ".join(f) or "defaults")
def test_the_shared_flags_open_the_session_the_cli_opens(flags: list[str]) -> None:
    cli_args = cli.build_parser().parse_args(["-m", str(MODEL), "--session", "--chatml", *flags])
    ours = session_config(build_parser().parse_args(["-m", str(MODEL), *flags]), MODEL)
    theirs = cli._config(cli_args)
    assert ours == attrs.evolve(theirs, n_predict=ours.n_predict)
    assert ours.chat


def test_sampling_flags_are_the_defaults_of_requests() -> None:
    args = build_parser().parse_args(
        ["--temp", "0.7", "--top-k", "20", "--top-p", "0.9", "--seed", "5", "-n", "64"]
    )
    assert serve_defaults(args) == ServeDefaults(
        sampling=SamplingParams(temp=0.7, top_k=20, top_p=0.9, seed=5), max_tokens=64
    )
    cli_args = cli.build_parser().parse_args(
        ["--temp", "0.7", "--top-k", "20", "--top-p", "0.9", "--seed", "5"]
    )
    assert serve_defaults(args).sampling == sampling_params(cli_args)


def test_by_default_requests_are_greedy_and_may_fill_the_context() -> None:
    defaults = serve_defaults(build_parser().parse_args([]))
    assert defaults.sampling.greedy
    assert defaults.max_tokens is None


def test_the_model_id_is_the_alias_or_the_file_name() -> None:
    assert model_id(build_parser().parse_args([]), MODEL) == "big-moe"
    assert model_id(build_parser().parse_args(["--alias", "moe"]), MODEL) == "moe"


def test_the_server_listens_on_localhost_by_default() -> None:
    args = build_parser().parse_args([])
    assert (args.host, args.port) == ("127.0.0.1", 8080)


CLI_ONLY = {
    *("-p", "--prompt", "-n", "--n-predict", "--chatml", "--session", "--progress", "--ppl", "--csv"),
    "--image",
}


def test_every_flag_of_the_cli_that_opens_the_session_is_the_servers_too() -> None:
    def options(parser: object) -> dict[str, object]:
        actions = parser._actions  # type: ignore[attr-defined]
        return {opt: a.default for a in actions for opt in a.option_strings}

    cli_options = options(cli.build_parser())
    ours = options(build_parser())
    shared = {opt: default for opt, default in cli_options.items() if opt not in CLI_ONLY}
    assert {opt: ours.get(opt, "missing") for opt in shared} == shared
