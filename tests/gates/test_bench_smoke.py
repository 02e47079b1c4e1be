"""``python -m bmoe.bench`` end to end on the tiny ``qwen3moe``: stock llama-cpp-python and
bmoe streaming, each in its own process, the same prompt prefilled then the same
teacher-forced tokens, one round; and ``stock`` skipped, saying why, under a memory limit
smaller than the model."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def test_bench_runs_stock_and_streaming_and_checks_their_tokens(
    tiny_model_path: Callable[..., Path], tmp_path: Path
) -> None:
    model = tiny_model_path("qwen3moe")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "bmoe.bench",
        "-m",
        str(model),
        "--configs",
        "stock-norepack,stream",
        "--no-repack",  # bmoe in the file's layout: compared with stock-norepack
        "--budgets",
        "25%",
        "--warmup",
        "2",
        "--tokens",
        "6",
        "--rounds",
        "1",
        "--out",
        str(out),
        "--plan",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # --plan: the planner's prediction beside the streamed configuration's measure
    [planned] = [line for line in proc.stderr.splitlines() if line.startswith("bench: plan: ")]
    assert "decode tok/s predicted" in planned and "measured" in planned and "-bound predicted" in planned
    assert "MiB/token predicted" in planned and "prefill 464 tokens s predicted" in planned

    result = json.loads((out / "bench.json").read_text())
    summaries = {s["key"]: s for s in result["summaries"]}
    assert set(summaries) == {"stock-norepack", "stream-1"}  # 25% of 3 MiB of experts, rounded
    stream = summaries["stream-1"]
    assert stream["tok_s"] > 0 and stream["mib_per_tok"] > 0 and 0 <= stream["hit_rate"] < 1
    assert stream["kernel_mib_per_tok"] is not None and stream["peak_rss_bytes"] > 0
    assert stream["x_stock_norepack"] > 0 and stream["ceiling_tok_s"] > 0
    assert result["bandwidth"]["sequential"]["bytes"] > 0

    # the default prompt, prefilled in one llama_decode by both, then the decode after it
    assert result["prompt_tokens"] == 464 and result["n_ctx"] == 464 + 8
    for s in summaries.values():
        assert s["prompt_tokens"] == 464 and s["prefill_tok_s"] > 0 and s["prefill_s"] > 0
    [stream_run] = result["runs"]["stream-1"]
    assert stream_run["prefill_read_bytes"] > 0 and stream_run["prefill_stall_s"] >= 0
    assert stream["prefill_read_mib"] == stream_run["prefill_read_bytes"] / 2**20
    assert "prefill_read_bytes" not in result["runs"]["stock-norepack"][0]  # no streamer there
    # the read path's CPU: the process's minor page faults and system time, decode and prefill
    assert stream_run["minor_faults"] >= 0 and stream_run["system_s"] >= 0
    assert stream_run["prefill_minor_faults"] > 0 and stream_run["prefill_system_s"] >= 0
    assert stream["faults_per_tok"] == pytest.approx(stream_run["minor_faults"] / 6)
    assert stream["prefill_x_stock"] == stream["prefill_tok_s"] / summaries["stock-norepack"]["prefill_tok_s"]
    assert result["prefill_baseline"]["key"] == "stock-norepack"  # stock was not asked for
    assert result["prefill_baseline"]["stock_state"] == "not run"

    [check] = result["token_checks"]
    assert check["key"] == "stream-1" and check["reference"] == "stock-norepack"
    assert check["equal"] and check["compared"] == 8
    assert result["routing"]["hit_rate"] == stream["hit_rate"]

    md = (out / "bench.md").read_text()
    assert "| bmoe stream, cache 1 MiB" in md and "routing check:" in md
    assert "| prefill tok/s | prefill x stock-norepack (stock not run) |" in md
    assert "Prefill: the text's first 464 tokens in one `llama_decode`" in md
    assert "minor page faults per decoded token; the prefill" in md
    assert "the same 8 greedy tokens as stock llama-cpp-python (mmap, repacking off)" in md
    assert md in proc.stdout
    assert "round 1/1: bmoe stream" in proc.stderr  # progress goes to stderr
    assert "prefill " in proc.stderr and "tok/s over 464 tokens in batches of 512, decode " in proc.stderr


def test_stock_under_a_limit_smaller_than_the_model_is_said_up_front_and_skipped(
    tiny_model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """The tiny model (4.4 MiB) in a 2 MiB group: ``stock`` is not started, the report says why;
    nothing else is asked, so nothing loads the model."""
    model = tiny_model_path("qwen3moe")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "bmoe.bench", "-m", str(model), "--configs", "stock", "--mem-limit-mb", "2"]
    cmd += ["--warmup", "2", "--tokens", "6", "--rounds", "1", "--no-chart", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode == 2 and "memory cgroup" in proc.stderr:
        pytest.skip(f"no writable memory cgroup here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    mib = model.stat().st_size / 2**20
    reason = (
        f"llama.cpp's default load repacks the weights into {mib:.1f} MiB of anonymous memory, more "
        "than the 2 MiB limit (run stock-norepack, or raise --mem-limit-mb)"
    )
    assert f"bench: stock: skipped: {reason}\n" in proc.stderr
    assert proc.stderr.index("stock: skipped") < proc.stderr.index("bench: disk:")  # before measuring
    assert "round 1/1" not in proc.stderr  # no process started for it
    result = json.loads((out / "bench.json").read_text())
    assert result["skipped"] == {"stock": reason} and result["runs"] == {"stock": []}
    [summary] = result["summaries"]
    assert summary["skipped"] == reason and summary["tok_s"] is None
    assert f"| stock llama-cpp-python (mmap, its defaults: repacking on) | skipped: {reason} |" in proc.stdout


def test_a_configuration_whose_child_dies_of_a_signal_is_a_row_and_the_others_run(
    tiny_model_path: Callable[..., Path], tmp_path: Path, crashing_env: dict[str, str]
) -> None:
    """bmoe's children die of SIGSEGV at their prompt (``crashing_env``); stock's (llama-cpp-
    python's own classes, untouched) runs: the bench ends, the stream row says "crashed
    (SIGSEGV), see LOG" with the crash line, and the log holds the child's stderr."""
    model = tiny_model_path("qwen3moe")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "bmoe.bench", "-m", str(model), "--configs", "stock-norepack,stream"]
    cmd += ["--no-repack", "--budgets", "25%", "--warmup", "2", "--tokens", "6", "--rounds", "1"]
    cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=crashing_env)
    result = json.loads((out / "bench.json").read_text())
    runs = result["runs"]
    assert "tok_s" in runs["stock-norepack"][0], proc.stderr
    crashed = runs["stream-1"][0]
    assert crashed["crashed"] == "SIGSEGV", crashed
    log = out / "logs" / "stream-1-round1.log"
    expected = f"crashed (SIGSEGV), see {log}: bmoe: the process died of SIGSEGV while running"
    assert crashed["error"].startswith(expected), crashed
    assert "bmoe: the process died of SIGSEGV" in log.read_text()
    assert "crashed (SIGSEGV)" in (out / "bench.md").read_text()


def test_bench_parallel_runs_each_configuration_at_each_count_and_checks_tokens_per_count(
    tiny_model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """``--parallel 1,3``: stock, bmoe resident and streamed, each at one and at three
    sequences per ``llama_decode``; at each count bmoe's greedy tokens (every sequence's)
    equal stock's, and the parallel table puts each count beside one sequence."""
    model = tiny_model_path("qwen3moe")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "bmoe.bench",
        "-m",
        str(model),
        "--configs",
        "stock-norepack,resident,stream",
        "--no-repack",
        "--budgets",
        "25%",
        "--parallel",
        "1,3",
        "--prompt-tokens",
        "8",
        "--warmup",
        "2",
        "--tokens",
        "5",
        "--rounds",
        "1",
        "--no-chart",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    result = json.loads((out / "bench.json").read_text())
    assert result["parallel"] == [1, 3]
    summaries = {s["key"]: s for s in result["summaries"]}
    keys = {f"{k}-np{n}" for k in ("stock-norepack", "resident", "stream-1") for n in (1, 3)}
    assert set(summaries) == keys
    for key in keys:
        [run] = result["runs"][key]
        n = run["parallel"]
        assert len(run["seq_argmax"]) == n and run["measured_tokens"] == 5 * n
        assert run["prompt_tokens"] == 8 * n
        assert run["tok_s"] == pytest.approx(n * run["seq_tok_s"])
        assert run["n_ctx"] >= n * 15
    # the three sequences were fed different texts, sequence 0 the same at both counts
    three = result["runs"]["stock-norepack-np3"][0]["seq_argmax"]
    assert three[0] != three[1] != three[2]
    checks = {(c["key"], c["reference"]): c for c in result["token_checks"]}
    for n in (1, 3):
        for key in ("resident", "stream-1"):
            check = checks[(f"{key}-np{n}", f"stock-norepack-np{n}")]
            assert check["equal"] and check["compared"] == 7 * n
    assert summaries["stream-1-np3"]["x_stock_norepack"] == pytest.approx(
        summaries["stream-1-np3"]["tok_s"] / summaries["stock-norepack-np3"]["tok_s"]
    )
    md = (out / "bench.md").read_text()
    assert "### Sequences decoded together" in md
    assert "| resident | 3 |" in md and "| stream-1 | 1 |" in md
    assert "sequence 0 chose" in md


def _bench(model: Path, out: Path, *flags: str) -> dict:
    cmd = [sys.executable, "-m", "bmoe.bench", "-m", str(model), "--configs", "resident,stream"]
    cmd += ["--budgets", "25%", "--warmup", "2", "--tokens", "6", "--rounds", "1", "--no-chart"]
    cmd += ["--out", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "bench.json").read_text())


def test_a_prompt_longer_than_the_text_and_a_batch_is_prefilled_in_batches_and_its_passes_counted(
    tiny_model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """``--prompt-tokens`` past the built-in text (held-out corpus text follows it) and past a
    batch: every configuration takes it in batches of ``-b``, the report says the batch and how
    many times over the streamed prefill read the experts; with ``-b auto`` the streamed
    configuration sizes its batch from the room (here the whole prompt: each expert read at most
    once) and its tokens, after another batch than resident's, are compared but not required."""
    model = tiny_model_path("qwen3moe")
    fixed = _bench(model, tmp_path / "fixed", "--prompt-tokens", "1500", "-b", "256")
    assert fixed["text"] == "the built-in English text, then held-out corpus text"
    assert (fixed["prompt_tokens"], fixed["batch"], fixed["n_ctx"]) == (1500, 256, 1508)
    by_key = {s["key"]: s for s in fixed["summaries"]}
    for s in by_key.values():
        assert s["prompt_tokens"] == 1500 and s["prefill_ubatch"] == 256 and s["prefill_tok_s"] > 0
    stream = by_key["stream-1"]
    assert stream["prefill_passes"] == stream["prefill_read_mib"] * 2**20 / fixed["expert_bytes"]
    assert stream["prefill_passes"] > 1  # six batches, a cache of a quarter of the experts
    [check] = fixed["token_checks"]
    assert check["equal"] and check["required"] and check["compared"] == 8
    md = (tmp_path / "fixed" / "bench.md").read_text()
    assert "Prefill: the text's first 1500 tokens in batches (n_batch = n_ubatch = 256 everywhere)" in md
    assert "teacher forcing over the built-in English text, then held-out corpus text" in md
    assert "the prefill of 1500 tokens in batches of 256 planned" in md and "times over)" in md

    sized = _bench(model, tmp_path / "sized", "--prompt-tokens", "1500", "-b", "auto")
    by_key = {s["key"]: s for s in sized["summaries"]}
    assert by_key["resident"]["prefill_ubatch"] == 512
    stream = by_key["stream-1"]
    assert stream["prefill_ubatch"] >= 1500 and stream["prefill_passes"] <= 1.0
    [check] = sized["token_checks"]
    assert check["ubatches"] == [stream["prefill_ubatch"], 512] and not check["required"]


def test_bench_draft_copy_runs_its_three_measures(
    tiny_model_path: Callable[..., Path], tmp_path: Path
) -> None:
    model = tiny_model_path("qwen3moe")
    out = tmp_path / "drafts"
    cmd = [sys.executable, "-m", "bmoe.bench", "--draft", "copy", "-m", str(model), "--budgets", "1"]
    cmd += ["--warmup", "2", "--tokens", "24", "--rounds", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads((out / "drafts.json").read_text())
    assert [r["name"] for r in figures["accept"]["accept"]] == [
        "copying old_str from the file",
        "new_str repeating old_str",
    ]
    union = {u["rows"]: u["mib_per_batch"] for u in figures["union"]["union"]}
    assert sorted(union) == [1, 2, 4, 9, 17, 33, 64]
    assert union[1] < union[2] <= union[64]  # two rows read more than one, never more than all
    runs = figures["end_to_end"]
    assert [(r["transcript"], r["draft"]) for r in runs] == [
        ("agent edit", "off"),
        ("agent edit", "copy"),
        ("plain prose", "off"),
        ("plain prose", "copy"),
    ]
    edit = runs[1]
    assert edit["measured_tokens"] == 24 and edit["drafts"]["accepted"] > 0
    assert len(edit["argmax"]) == len(runs[0]["argmax"]) == 26  # a choice after every fed token
    text = (out / "drafts.md").read_text()
    assert "### 3. End to end" in text and "failed" not in text
