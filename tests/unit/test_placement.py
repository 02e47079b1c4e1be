"""Placement settings as llama.cpp's flags: what stays on the host, what is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bmoe.domain.decide import DecideConfig
from bmoe.domain.moe_arch import expert_projections
from bmoe.domain.placement import (
    Placement,
    check_placement,
    expert_pattern,
    parse_device_names,
    parse_rpc_servers,
)
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ConfigError

PROJECTIONS = expert_projections("qwen3moe") or ()


def test_rpc_servers_parse_as_llama_cpp_writes_them() -> None:
    assert parse_rpc_servers("127.0.0.1:50052, pc2:50053") == ("127.0.0.1:50052", "pc2:50053")
    assert parse_rpc_servers("[::1]:50052") == ("[::1]:50052",)
    for bad in ("", "host", "host:0", "host:70000", "a b:1"):
        with pytest.raises(ConfigError, match="--rpc"):
            parse_rpc_servers(bad)


def test_device_names_parse_as_a_comma_list() -> None:
    assert parse_device_names(None) == () and parse_device_names("") == ()
    assert parse_device_names("CUDA0, RPC1,") == ("CUDA0", "RPC1")


def test_the_expert_pattern_matches_expert_tensors_only() -> None:
    every = re.compile(expert_pattern(PROJECTIONS))
    layer2 = re.compile(expert_pattern(PROJECTIONS, 2))
    assert every.search("blk.11.ffn_up_exps.weight") and every.search("blk.0.ffn_gate_up_exps.weight")
    assert not every.search("blk.1.ffn_gate_inp.weight") and not every.search("blk.1.ffn_up_shexp.weight")
    assert layer2.search("blk.2.ffn_down_exps.weight")
    assert not layer2.search("blk.12.ffn_down_exps.weight")


def test_streaming_keeps_every_expert_on_the_host_unless_n_cpu_moe_says_otherwise() -> None:
    offloaded = Placement(n_gpu_layers=4)
    assert offloaded.host_expert_patterns(PROJECTIONS, streaming=True) == (expert_pattern(PROJECTIONS),)
    assert offloaded.host_expert_patterns(PROJECTIONS, streaming=False) == ()  # they follow their layer
    cpu_moe = Placement(n_gpu_layers=4, cpu_moe=True)
    assert cpu_moe.host_expert_patterns(PROJECTIONS, streaming=False) == (expert_pattern(PROJECTIONS),)
    first_two = Placement(n_gpu_layers=4, n_cpu_moe=2)
    assert first_two.host_expert_patterns(PROJECTIONS, streaming=True) == (
        expert_pattern(PROJECTIONS, 0),
        expert_pattern(PROJECTIONS, 1),
    )
    assert Placement().host_expert_patterns(PROJECTIONS, streaming=True) == ()  # all on the CPU anyway


def test_the_summary_says_it_in_llama_cpp_flags() -> None:
    assert Placement().summary() == ""
    p = Placement(n_gpu_layers=8, rpc=("h:1",), n_cpu_moe=3)
    assert p.summary() == "-ngl 8 --rpc h:1 --n-cpu-moe 3"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_gpu_layers": -1}, "-ngl"),
        ({"n_gpu_layers": 1, "n_cpu_moe": -1}, "--n-cpu-moe"),
        ({"n_gpu_layers": 1, "n_cpu_moe": 1, "cpu_moe": True}, "exclude"),
        ({"rpc": ("h:1",)}, "-ngl"),
        ({"devices": ("CUDA0",)}, "-ngl"),
    ],
)
def test_settings_that_cannot_work_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Placement(**kwargs)  # type: ignore[arg-type]


def test_what_does_not_combine_with_devices_yet_is_refused() -> None:
    on_device = Placement(n_gpu_layers=2)
    with pytest.raises(ConfigError, match="decide-probe"):
        check_placement(on_device, StreamConfig(), DecideConfig(enabled=True, probe=Path("p.jsonl")))
    check_placement(on_device, StreamConfig(enabled=True), DecideConfig(enabled=True))
    with pytest.raises(ConfigError, match="routing"):
        check_placement(on_device, StreamConfig(enabled=True, route_ahead=1), DecideConfig())
    check_placement(on_device, StreamConfig(enabled=True), DecideConfig())
    check_placement(Placement(), StreamConfig(enabled=True, route_ahead=1), DecideConfig(enabled=True))
