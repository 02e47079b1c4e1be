"""The AMX choice (``--amx``), the crash line's words, and the weights' words beside them."""

from __future__ import annotations

import pytest

from bmoe.domain.cpu_features import AmxVerdict, check_amx_mode, choose_amx
from bmoe.domain.crash import CRASH_PREFIX, crash_line_in, crash_text
from bmoe.domain.weight_layout import WeightLayout
from bmoe.errors import ConfigError

WORKS = AmxVerdict(usable=True, why="the tile instructions ran")
FAULTS = AmxVerdict(usable=False, why="the tile instructions fault on this CPU (SIGSEGV in the probe)")


def never() -> AmxVerdict:
    raise AssertionError("probed where the answer decides nothing")


def test_auto_uses_amx_only_where_the_probe_ran_it() -> None:
    used = choose_amx("auto", True, lambda: WORKS)
    assert used.use and not used.self_placed and used.refused == () and used.note == ""
    refused = choose_amx("auto", True, lambda: FAULTS)
    assert not refused.use and refused.self_placed and refused.refused == ("AMX",)
    assert refused.note == f"AMX refused: {FAULTS.why} (--amx on uses it anyway)"


def test_no_probe_where_llama_cpp_offers_no_amx_or_the_user_decided() -> None:
    assert choose_amx("auto", False, never) == choose_amx("on", False, never)
    assert not choose_amx("auto", False, never).self_placed
    assert choose_amx("on", True, never).use


def test_off_places_the_weights_itself_everywhere_and_says_so_only_where_amx_was_offered() -> None:
    offered = choose_amx("off", True, never)
    assert offered.self_placed and not offered.use and offered.note == "AMX off (--amx off)"
    absent = choose_amx("off", False, never)
    assert absent.self_placed and absent.note == ""


def test_an_unknown_mode_is_refused_naming_the_choices() -> None:
    assert check_amx_mode("on") == "on"
    with pytest.raises(ConfigError, match="auto, on, off"):
        check_amx_mode("yes")


def test_the_crash_line_names_the_buffer_types_and_the_flags_that_avoid_them() -> None:
    assert crash_text("running m.gguf", ["CPU_Mapped", "AMX", "CPU_REPACK", "AMX"]) == (
        " while running m.gguf (weights in CPU_Mapped, AMX, CPU_REPACK); --amx off or --no-repack "
        "avoids llama.cpp's extra kernels (docs/machines.md)"
    )
    assert crash_text("loading m.gguf", []) == " while loading m.gguf (docs/machines.md)"
    assert crash_text("running m.gguf", ["CPU_Mapped"]) == (
        " while running m.gguf (weights in CPU_Mapped) (docs/machines.md)"
    )
    line = f"{CRASH_PREFIX}SIGSEGV while running m.gguf"
    assert crash_line_in(["loading", line, "Fatal Python error"]) == line
    assert crash_line_in(["no crash here"]) is None


def test_the_weights_words_name_each_buffer_type_and_the_refusal() -> None:
    mib = 1048576
    both = (("AMX", 2 * mib), ("CPU_REPACK", mib))
    stock = WeightLayout(asked=True, available=True, by_llama=True, dense_bytes=3 * mib, buffers=both)
    assert stock.summary() == "weights repacked by llama.cpp at load (AMX 2.0 MiB, CPU_REPACK 1.0 MiB)"
    placed = WeightLayout(
        asked=True, available=True, resident=True, dense_tensors=21, dense_bytes=3 * mib,
        buffers=(("CPU_REPACK", 3 * mib),), note="AMX refused: it faults",
    )  # fmt: skip
    assert placed.summary() == (
        "weights repacked by bmoe at load (21 tensors, CPU_REPACK 3.0 MiB); AMX refused: it faults"
    )
    streamed = WeightLayout(
        asked=True, available=True, dense_tensors=12, dense_bytes=3 * mib, expert_tensors=9,
        expert_tensors_total=9, buffers=(("AMX", 2 * mib), ("CPU_REPACK", mib)),
    )  # fmt: skip
    assert streamed.summary() == (
        "weights repacked (dense 12 tensors, 3.0 MiB: AMX 2.0 MiB, CPU_REPACK 1.0 MiB; "
        "experts 9 of 9 tensors, as read)"
    )
