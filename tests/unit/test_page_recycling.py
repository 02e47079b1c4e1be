"""When page recycling may be used: the worst case of mappings it leaves, against the
process's limit (vm.max_map_count) and a headroom for everything else."""

from __future__ import annotations

from bmoe.domain.streaming.page_recycling import recycling_fits, worst_case_mappings

LIMIT = 65530  # Linux's default vm.max_map_count


def test_models_of_the_sizes_bmoe_targets_fit_the_default_limit() -> None:
    assert recycling_fits(16 * 128 * 3, LIMIT, in_use=500)  # the bench model
    assert recycling_fits(48 * 128 * 3, LIMIT, in_use=500)  # a Qwen3-30B-A3B
    assert recycling_fits(36 * 128 * 3, LIMIT, in_use=500)  # a gpt-oss-120b


def test_a_model_with_too_many_slices_does_not() -> None:
    assert not recycling_fits(94 * 128 * 3, LIMIT, in_use=500)  # a Qwen3-235B-A22B: 72,192 mappings
    assert recycling_fits(94 * 128 * 3, 262144, in_use=500)  # fine under a raised limit


def test_the_headroom_is_an_eighth_of_the_limit_and_at_least_8192() -> None:
    n = 1000
    assert recycling_fits(n, worst_case_mappings(n) + 8192, in_use=0)
    assert not recycling_fits(n, worst_case_mappings(n) + 8191, in_use=0)
    big = 800000
    assert recycling_fits(n, big, in_use=big - big // 8 - worst_case_mappings(n))
    assert not recycling_fits(n, big, in_use=big - big // 8 - worst_case_mappings(n) + 1)
