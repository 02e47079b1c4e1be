"""The ``mode:`` line's and ``BMOE_READY``'s words for which weights compute repacked."""

from __future__ import annotations

from bmoe.domain.weight_layout import WeightLayout


def test_each_reason_for_the_files_layout_is_named() -> None:
    assert WeightLayout(asked=False).summary() == "weights in the file's layout (--no-repack)"
    assert WeightLayout(asked=True).summary() == (
        "weights in the file's layout (this llama.cpp has no CPU_REPACK buffer type)"
    )
    assert WeightLayout(asked=True, available=True).summary() == (
        "weights in the file's layout (no weight of this model has a repacked form on this CPU)"
    )
    assert not any(
        w.repacked for w in (WeightLayout(asked=False), WeightLayout(asked=True, available=True))
    )


def test_repacked_weights_are_counted_by_who_repacked_them() -> None:
    resident = WeightLayout(asked=True, available=True, by_llama=True, dense_bytes=3 * 1048576 // 2)
    assert resident.repacked
    assert resident.summary() == "weights repacked by llama.cpp at load (CPU_REPACK 1.5 MiB)"
    streamed = WeightLayout(
        asked=True, available=True, dense_tensors=64, dense_bytes=162 * 1048576, expert_tensors=40,
        expert_tensors_total=48,
    )  # fmt: skip
    assert streamed.repacked
    assert streamed.summary() == (
        "weights repacked (dense 64 tensors, 162.0 MiB; experts 40 of 48 tensors, as read)"
    )
    assert WeightLayout(asked=True, available=True, expert_tensors=1).repacked
