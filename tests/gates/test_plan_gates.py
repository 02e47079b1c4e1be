"""``python -m bmoe.plan``: the built-in model's plan, and ``-hf`` planning against a local
stand-in for the Hub (tests/hf_range_server.py) that serves GGUF files with range requests
and counts every byte it sends: the header only is fetched, each shard's for a split
model, and a file that is cut short, not GGUF or served without ranges is an error that
names it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from bmoe.adapters.gguf_header import FIRST_BLOCK
from bmoe.adapters.gguf_layout import read_layout
from bmoe.domain.plan.predict import PlanSettings
from bmoe.errors import ModelFetchError
from bmoe.runtime.planning import MachineOptions, plan_hf, plan_local
from bmoe.testing.fixtures import fixture_files
from hf_range_server import HubStandIn, serving

OPTIONS = MachineOptions(mem_limit_mb=2048, disk_mib_s=400)


def _header_end(path: Path) -> int:
    return min(t.offset for t in read_layout(path).tensors.values() if t.file_index == 0)


@pytest.fixture
def hub(tiny_model_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    whole = tiny_model_path("qwen3moe")
    split = tiny_model_path("qwen3moe-split")
    files: dict[str, dict[str, bytes | Path]] = {
        "bmoe/tiny-GGUF": {"README.md": b"# tiny", "tiny-Q4_K_M.gguf": whole, "tiny-Q8_0.gguf": whole},
        "bmoe/split-GGUF": {p.name: p for p in fixture_files("qwen3moe-split", split.parent)},
        "bmoe/cut-GGUF": {"cut-Q4_K_M.gguf": whole.read_bytes()[:3000]},
        "bmoe/html-GGUF": {"page-Q4_K_M.gguf": b"<!doctype html><title>Sign in</title>" * 20},
    }
    with serving(HubStandIn(files)) as stand_in:
        monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
        yield stand_in


def test_the_hf_plan_fetches_the_header_only_and_equals_the_local_plan(
    hub: HubStandIn, tiny_model_path
) -> None:
    local = plan_local(tiny_model_path("qwen3moe"), PlanSettings(), OPTIONS).plan
    remote = plan_hf("bmoe/tiny-GGUF:Q4_K_M", None, PlanSettings(), OPTIONS)
    served = hub.served["bmoe/tiny-GGUF/tiny-Q4_K_M.gguf"]
    size = tiny_model_path("qwen3moe").stat().st_size
    assert (
        _header_end(tiny_model_path("qwen3moe"))
        <= served
        <= max(FIRST_BLOCK, 2 * _header_end(tiny_model_path("qwen3moe")))
    )
    assert served < size / 10
    assert set(hub.served) == {"bmoe/tiny-GGUF/tiny-Q4_K_M.gguf"}  # the other quant untouched
    assert f"{served / 1024:.0f} KiB fetched" in remote.source
    assert attrs.evolve(remote.plan.model, name="") == attrs.evolve(local.model, name="")
    assert remote.plan.budget.bytes == local.budget.bytes and remote.plan.flags()[:6] == local.flags()[:6]


def test_a_split_model_is_planned_from_each_shards_header(hub: HubStandIn, tiny_model_path) -> None:
    split = tiny_model_path("qwen3moe-split")
    shards = fixture_files("qwen3moe-split", split.parent)
    remote = plan_hf("bmoe/split-GGUF", None, PlanSettings(), OPTIONS)
    whole = plan_local(tiny_model_path("qwen3moe"), PlanSettings(), OPTIONS).plan.model
    assert sorted(hub.served) == [f"bmoe/split-GGUF/{p.name}" for p in shards]
    for shard in shards:
        served = hub.served[f"bmoe/split-GGUF/{shard.name}"]
        assert served <= max(FIRST_BLOCK, 2 * _header_end(shard)) and served < shard.stat().st_size
    m = remote.plan.model
    assert m.file_bytes == sum(p.stat().st_size for p in shards)
    assert (m.expert_bytes, m.token_cycle_bytes, m.kv_bytes_per_token) == (
        whole.expert_bytes,
        whole.token_cycle_bytes,
        whole.kv_bytes_per_token,
    )
    assert "3 files' headers" in remote.source


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("bmoe/cut-GGUF", "bmoe/cut-GGUF/cut-Q4_K_M.gguf is truncated"),
        ("bmoe/html-GGUF", "bmoe/html-GGUF/page-Q4_K_M.gguf is not a GGUF file"),
        ("bmoe/none-GGUF", "bmoe/none-GGUF: the Hub answered 404"),
    ],
)
def test_a_truncated_or_foreign_answer_is_an_error_naming_the_file(
    hub: HubStandIn, spec: str, said: str
) -> None:
    with pytest.raises(ModelFetchError, match=said.replace(".", r"\.")):
        plan_hf(spec, None, PlanSettings(), OPTIONS)


def test_a_server_without_ranges_is_refused_before_the_file_comes(hub: HubStandIn) -> None:
    hub.mode = "no-range"
    with pytest.raises(ModelFetchError, match="not 206"):
        plan_hf("bmoe/tiny-GGUF", None, PlanSettings(), OPTIONS)


def test_the_command_prints_the_fetched_bytes_and_the_json_figures(hub: HubStandIn) -> None:
    argv = [sys.executable, "-m", "bmoe.plan", "-hf", "bmoe/tiny-GGUF:Q8_0", "--disk-mib-s", "400"]
    env_keeps = {"HF_ENDPOINT": hub.url}
    text = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(env_keeps))
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].startswith("bmoe/tiny-GGUF/tiny-Q8_0.gguf: read its header only")
    js = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=120, env=_env(env_keeps))
    doc = json.loads(js.stdout)
    assert doc["model"]["arch"] == "qwen3moe" and doc["streamed"]["decode_bound"] in ("disk", "compute")
    assert "--cache-mb" in doc["flags"]
    # the compute rates are llama.cpp's own kernels, timed here (the tiny model: Q8_0)
    assert doc["machine"]["compute_source"].startswith("llama.cpp's Q8_0 kernels timed here")
    assert doc["machine"]["matmul_flops"] > 0 and doc["machine"]["matvec_bytes_s"] > 0
    bad = subprocess.run(
        [sys.executable, "-m", "bmoe.plan", "-hf", "bmoe/cut-GGUF"],
        capture_output=True,
        text=True,
        env=_env(env_keeps),
    )
    assert bad.returncode == 1 and "bmoe/cut-GGUF/cut-Q4_K_M.gguf is truncated" in bad.stderr


def _env(extra: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **extra}


def test_the_compute_buffer_estimate_is_near_llama_cpps_and_the_kv_cache_exact(tiny_model_path) -> None:
    from bmoe.adapters.llama import LlamaModel
    from bmoe.adapters.llama.context import ContextParams
    from bmoe.runtime.model_figures import model_figures
    from bmoe.runtime.prompt_sizing import probe

    path = tiny_model_path("qwen3moe")
    figures = model_figures(read_layout(path), path, "qwen3moe")
    model = LlamaModel(path)
    try:
        for n_ctx in (256, 1024):
            for flash in (False, True):
                per_token, kv = probe(model, ContextParams(n_ctx=n_ctx, flash_attn="on" if flash else "off"))
                assert kv == figures.kv_bytes(n_ctx)
                assert per_token * 0.9 <= figures.compute_per_token(n_ctx, flash) <= per_token * 1.6
    finally:
        model.close()


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_a_prompt_token_counts_every_layers_weights_but_a_pruned_last_ffn(tiny_model_path, arch: str) -> None:
    """Counted again with the ``gguf`` library's reader: every 2-D weight of every block,
    the routed experts at k of n; qwen3moe's graph runs its last FFN for one token a batch
    (tests/gates/test_route_recorder.py), so a prompt token skips that layer's FFN there."""
    from gguf import GGUFReader

    from bmoe.runtime.model_figures import model_figures

    path = tiny_model_path(arch)
    figures = model_figures(read_layout(path), path, arch)
    reader = GGUFReader(path)
    last = f"blk.{figures.n_layer - 1}.ffn_"
    share = figures.n_expert_used / figures.n_expert
    expected = 0.0
    for t in reader.tensors:
        if not t.name.startswith("blk.") or not t.name.endswith(".weight") or len(t.shape) < 2:
            continue
        if arch == "qwen3moe" and t.name.startswith(last):
            continue
        expected += int(t.n_elements) * (share if "_exps" in t.name else 1.0)
    assert figures.prompt_weights == pytest.approx(expected, abs=2)
    assert 0 < figures.prompt_weights < figures.active_bytes / figures.bytes_per_weight * 4
