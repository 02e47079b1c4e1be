"""The usage profile's policy (decay, merge, the warm set, the document) and its file (the
content key, atomic merges under a lock, untrusted files refused)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from bmoe.adapters.usage_profile_file import (
    model_key,
    profile_path,
    read_profile,
    update_profile,
)
from bmoe.domain.streaming.usage_profile import (
    ProfileRejected,
    UsageProfile,
    from_document,
    merge,
    routed_tokens,
    to_document,
    warm_set,
)

KEY = "k" * 24


def profile(counts: list[float], n_layer: int = 2, n_expert: int = 4, **kw: float) -> UsageProfile:
    return UsageProfile(KEY, n_layer, n_expert, tuple(counts), **kw)  # type: ignore[arg-type]


# -- the policy ------------------------------------------------------------------------------


def test_merge_decays_the_old_counts_by_the_new_tokens_half_life() -> None:
    p = profile([8, 0, 0, 0, 0, 0, 0, 4], tokens=10.0)
    got = merge(p, [0, 2, 0, 0, 0, 0, 0, 0], tokens=100.0, half_life_tokens=100.0, new_session=True)
    assert got.counts == (4.0, 2.0, 0, 0, 0, 0, 0, 2.0)
    assert got.tokens == 105.0 and got.sessions == 1
    assert merge(got, [0] * 8, tokens=0.0).counts == got.counts  # nothing new: nothing decays


def test_merge_refuses_another_shape_and_negative_counts() -> None:
    p = profile([0] * 8)
    with pytest.raises(ValueError):
        merge(p, [1] * 7, 1.0)
    with pytest.raises(ValueError):
        merge(p, [-1] + [0] * 7, 1.0)


def test_routed_tokens_is_the_busiest_layer_over_k() -> None:
    # layer 0 has no experts (routed nothing), layers 1 and 2 saw 3 tokens of k=2
    assert routed_tokens([0, 0, 0, 3, 2, 1, 4, 1, 1], 3, 3, 2) == 3.0


def test_the_warm_set_takes_the_hottest_entries_within_the_room_in_file_order() -> None:
    p = profile([5, 1, 9, 0, 7, 3, 0, 2])
    # entries of 10 bytes; budget 100, a token cycle of 40: room min(75, 60) = 60 -> 6 entries
    chosen = warm_set(p, [10, 10], budget_bytes=100, token_cycle_bytes=40, share=0.75)
    assert chosen.targets == ((0, (0, 1, 2)), (1, (0, 1, 3)))
    assert chosen.bytes == 60 and chosen.entries == 6
    assert chosen.share == pytest.approx(27 / 27)
    smaller = warm_set(p, [10, 10], budget_bytes=100, token_cycle_bytes=40, share=0.3)
    assert smaller.targets == ((0, (0, 2)), (1, (0,)))  # 9, 7, 5: the three hottest
    assert smaller.share == pytest.approx(21 / 27)


def test_the_warm_set_skips_layers_without_experts_and_entries_that_do_not_fit() -> None:
    p = profile([5, 1, 9, 0, 7, 3, 0, 2])
    assert warm_set(p, [0, 10], 100, 0, share=1.0).targets == ((1, (0, 1, 3)),)
    # layer 0's entries are 30 bytes: 9 (30) fits in 40, 7 (10) too, then 5 (30) and 3 (10) not
    assert warm_set(p, [30, 10], 40, 0, share=1.0).targets == ((0, (2,)), (1, (0,)))
    assert warm_set(p, [10, 10], 30, 40, share=1.0).entries == 0  # no room beyond the cycle


def test_a_profile_goes_through_its_document_unchanged() -> None:
    p = profile([5, 1.5, 9, 0, 7, 3, 0, 2], tokens=12.5, sessions=3)
    doc = json.loads(json.dumps(to_document(p)))
    assert from_document(doc, KEY, 2, 4) == p


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"format": "x"}, "not a bmoe usage profile"),
        ({"version": 2}, "version"),
        ({"model_key": "other"}, "another model"),
        ({"n_expert": 5}, "another shape"),
        ({"counts": [[1, 2, 3, 4]]}, "truncated"),
        ({"counts": [[1, 2, 3, 4], [1, 2, 3]]}, "truncated"),
        ({"counts": [[1, 2, 3, 4], [1, 2, 3, "4"]]}, "not a number"),
        ({"counts": [[1, 2, 3, 4], [1, 2, 3, True]]}, "not a number"),
        ({"counts": [[1, 2, 3, 4], [1, 2, 3, -4]]}, "negative"),
        ({"counts": [[1, 2, 3, 4], [1, 2, 3, float("nan")]]}, "negative or not a number"),
        ({"tokens": None}, "missing"),
    ],
)
def test_an_untrusted_document_is_refused_with_the_reason(change: dict[str, object], why: str) -> None:
    doc = to_document(profile([1] * 8)) | change
    with pytest.raises(ProfileRejected, match=why):
        from_document(doc, KEY, 2, 4)
    with pytest.raises(ProfileRejected):
        from_document([doc], KEY, 2, 4)


# -- the file --------------------------------------------------------------------------------


def test_the_model_key_follows_the_content_not_the_path(tmp_path: Path) -> None:
    a = tmp_path / "a.gguf"
    a.write_bytes(bytes(range(256)) * 40000)
    b = tmp_path / "b.gguf"
    b.write_bytes(a.read_bytes())
    assert model_key([a]) == model_key([b])
    data = bytearray(a.read_bytes())
    data[-10] ^= 1  # a byte of the last sampled block
    b.write_bytes(data)
    assert model_key([a]) != model_key([b])
    b.write_bytes(a.read_bytes() + b"\0")
    assert model_key([a]) != model_key([b])
    assert model_key([a, a]) != model_key([a])


def test_auto_lives_under_the_profile_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BMOE_PROFILE_DIR", str(tmp_path))
    assert profile_path("auto", KEY) == tmp_path / f"{KEY}.json"
    assert profile_path("off", KEY) is None
    assert profile_path("mine.json", KEY) == Path("mine.json")


def test_reading_no_file_is_no_profile_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "p.json"
    assert read_profile(file, KEY, 2, 4) is None
    file.write_text("{")
    with pytest.raises(ProfileRejected, match="not JSON"):
        read_profile(file, KEY, 2, 4)


def test_an_update_replaces_an_untrusted_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    file = tmp_path / "sub" / "p.json"
    file.parent.mkdir()
    file.write_text('{"format": "bmoe-usage-profile", "version": 1, "model_key": "x"}')
    merged, replaced = update_profile(file, KEY, 2, 4, lambda p: merge(p, [1] * 8, 1.0, new_session=True))
    assert replaced == "learned on another model"
    assert read_profile(file, KEY, 2, 4) == merged
    assert sorted(p.name for p in file.parent.iterdir()) == ["p.json", "p.json.lock"]


def _add_one(path: str) -> None:
    for _ in range(20):
        update_profile(Path(path), KEY, 2, 4, lambda p: merge(p, [1] * 8, 0.0))


def test_processes_sharing_a_profile_add_up(tmp_path: Path) -> None:
    file = tmp_path / "p.json"
    procs = [
        multiprocessing.get_context("fork").Process(target=_add_one, args=(str(file),)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    got = read_profile(file, KEY, 2, 4)
    assert got is not None and got.counts == (80.0,) * 8  # no update lost
