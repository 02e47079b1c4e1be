"""The prompt cache's disk tier: the policy's use of a slower tier (``PromptCache`` with a
``spill``: states leaving memory go there, a lookup weighs them, a refused one is passed
over) and the files themselves (``StateFiles``: checked whole before use, a corrupt,
truncated or foreign file refused with a warning and removed, within a byte limit)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.adapters.state_files import StateFiles, _name, state_identity
from bmoe.domain.decide.prefix_cache import StateBlob
from bmoe.domain.prompt_cache import PromptCache


def blob(n: int, fill: int = 0) -> StateBlob:
    return np.full(n, fill, dtype=np.uint8)


class DictSpill:
    """A slower tier in memory that may refuse named states."""

    def __init__(self) -> None:
        self.states: dict[tuple[int, ...], StateBlob] = {}
        self.bad: set[tuple[int, ...]] = set()

    def held(self) -> list[tuple[int, ...]]:
        return list(self.states)

    def put(self, tokens: tuple[int, ...], b: StateBlob) -> None:
        self.states[tokens] = b

    def take(self, tokens: tuple[int, ...]) -> StateBlob | None:
        return None if tokens in self.bad else self.states.get(tokens)

    def drop(self, tokens: tuple[int, ...]) -> None:
        self.states.pop(tokens, None)


def test_a_state_pushed_out_of_memory_goes_to_the_tier_and_comes_back() -> None:
    spill = DictSpill()
    cache = PromptCache(10, spill)
    cache.store([1, 2], blob(6, 1))
    cache.store([3, 4], blob(6, 2))  # [1, 2] leaves memory for the tier
    assert [k.tokens for k in cache.kept()] == [(3, 4)] and spill.held() == [(1, 2)]
    assert cache.counters.evicted == 1 and cache.counters.spilled == 1
    found = cache.lookup([1, 2, 9])
    assert found is not None and found.kept.tokens == (1, 2) and found.shared == 2
    assert bytes(found.kept.blob) == bytes(blob(6, 1))
    assert [k.tokens for k in cache.kept()] == [(1, 2)]  # back in memory; [3, 4] went down
    assert set(spill.held()) == {(1, 2), (3, 4)} and cache.counters.unspilled == 1
    cache.check_valid()


def test_the_longest_prefix_wins_across_the_tiers() -> None:
    spill = DictSpill()
    spill.put((1, 2, 3, 4), blob(2))
    cache = PromptCache(None, spill)
    cache.store([1, 2], blob(2))
    found = cache.lookup([1, 2, 3, 4, 5])
    assert found is not None and found.kept.tokens == (1, 2, 3, 4)
    assert cache.lookup([1, 2, 3, 4, 5], better_than=4) is None


def test_a_refused_state_is_passed_over_and_never_offered_again() -> None:
    spill = DictSpill()
    spill.put((1, 2, 3), blob(2))
    spill.bad.add((1, 2, 3))
    cache = PromptCache(None, spill)
    cache.store([1, 2], blob(2))
    found = cache.lookup([1, 2, 3, 4])
    assert found is not None and found.kept.tokens == (1, 2)  # the next best, in memory
    assert cache.counters.refused_spilled == 1 and spill.held() == []
    assert cache.lookup([1, 2, 3, 4], better_than=2) is None


def test_a_longer_state_supersedes_the_tiers_earlier_ones_and_persist_writes_the_rest() -> None:
    spill = DictSpill()
    spill.put((1, 2), blob(2))
    spill.put((7,), blob(2))
    cache = PromptCache(None, spill)
    cache.store([1, 2, 3], blob(2))
    assert spill.held() == [(7,)]
    assert cache.persist() == 1 and set(spill.held()) == {(7,), (1, 2, 3)}
    assert PromptCache(None).persist() == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("sl"), st.lists(st.integers(0, 3), min_size=1, max_size=4)), max_size=30
    )
)
def test_the_memory_tier_keeps_its_limit_whatever_comes_back(ops: list[tuple[str, list[int]]]) -> None:
    spill = DictSpill()
    cache = PromptCache(12, spill)
    for op, tokens in ops:
        if op == "s":
            cache.store(tokens, blob(len(tokens) * 2))
        else:
            found = cache.lookup([*tokens, 9])
            if found is not None:
                assert len(found.kept.tokens) >= found.shared
        cache.check_valid()
        assert cache.nbytes <= 12


# -- the files --------------------------------------------------------------------------

IDENTITY = state_identity("model-a", ("llama 0.3", "f16", 512))


def files(root: Path, limit: int = 1 << 20) -> tuple[StateFiles, list[str]]:
    lines: list[str] = []
    return StateFiles(root, IDENTITY, limit, lines.append), lines


def test_a_state_written_is_read_back_bit_for_bit_by_another_process(tmp_path: Path) -> None:
    first, _ = files(tmp_path)
    state = np.arange(1000, dtype=np.uint32).view(np.uint8)
    first.put((5, 6, 7), state)
    again, lines = files(tmp_path)  # a restart: the folder is indexed again
    assert again.held() == [(5, 6, 7)] and lines == []
    got = again.take((5, 6, 7))
    assert got is not None and bytes(got) == bytes(state) and not got.flags.writeable
    assert again.take((5, 6)) is None


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_corrupt_file_is_refused_with_a_warning_and_removed(tmp_path: Path, damage: str) -> None:
    store, lines = files(tmp_path)
    store.put((1, 2), blob(64, 7))
    (path,) = store.dir.glob("*.state")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2 + 20] ^= 0x10  # inside the state's bytes: only the checksum sees it
    path.write_bytes(
        bytes(data[: len(data) // 2] if damage == "truncate" else b"" if damage == "empty" else data)
    )
    opened, lines = files(tmp_path)
    assert opened.take((1, 2)) is None
    assert not path.exists() and opened.refused == 1 and opened.held() == []
    assert len(lines) == 1 and "refused" in lines[0] and str(path) in lines[0]


def test_a_file_of_another_model_or_context_is_refused(tmp_path: Path) -> None:
    other = StateFiles(tmp_path, state_identity("model-b", ("llama 0.3", "f16", 512)), 1 << 20)
    other.put((1, 2), blob(8))
    assert other.dir != files(tmp_path)[0].dir  # another folder: never looked at
    (path,) = other.dir.glob("*.state")
    mine, _ = files(tmp_path)
    copied = mine.dir / path.name  # copied in by hand
    copied.write_bytes(path.read_bytes())
    again, lines = files(tmp_path)
    assert again.held() == [] and not copied.exists()
    assert "another model or context" in lines[0]


def test_the_folder_stays_within_its_limit_least_recently_used_first(tmp_path: Path) -> None:
    store, _ = files(tmp_path, limit=3 * 200)
    for i in range(3):
        store.put((i,), blob(100))
        os.utime(store.dir / _name((i,)), (1_000_000 + i, 1_000_000 + i))  # written in that order
    assert store.take((0,)) is not None  # (0,) just used: (1,) is the oldest now
    store.put((3,), blob(100))
    store.put((4,), blob(100))
    assert store.nbytes <= 3 * 200
    assert (1,) not in store.held() and (0,) in store.held()
    store.put((9,), blob(1000))  # alone past the limit: not written
    assert (9,) not in store.held()


def test_without_room_in_memory_states_go_straight_to_the_tier() -> None:
    spill = DictSpill()
    cache = PromptCache(0, spill)  # --cache-ram 0 --cache-disk DIR
    cache.store([1, 2], blob(4))
    cache.store([1, 2, 3], blob(4))  # supersedes its conversation's earlier state there too
    assert len(cache) == 0 and spill.held() == [(1, 2, 3)] and cache.counters.spilled == 2
    found = cache.lookup([1, 2, 3, 4])
    assert found is not None and found.shared == 3 and len(cache) == 0  # lent, not kept


def test_a_file_is_sized_as_written_and_a_state_held_already_is_not_written_again(tmp_path: Path) -> None:
    store, _ = files(tmp_path)
    store.put((1, 2, 3), blob(100, 1))
    path = store.dir / _name((1, 2, 3))
    assert store.nbytes == path.stat().st_size
    inode = path.stat().st_ino
    store.put((1, 2, 3), blob(100, 1))  # persisted again at close: the file stays
    assert path.stat().st_ino == inode
    store.put((1, 2, 3), blob(101, 1))  # another state for the same tokens replaces it
    got = store.take((1, 2, 3))
    assert got is not None and got.nbytes == 101
