"""The vision encoder's keep (``bmoe.domain.media.image_keep``): values by key within a byte
limit, least recently used out, a turn's pinned pictures kept whatever the limit for
``pin_turns`` turns; driven with random operations against a plain model, and pinned with
examples."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.domain.media.image_keep import ImageKeep


def test_least_recently_used_goes_first_past_the_limit() -> None:
    keep: ImageKeep[str, str] = ImageKeep(10)
    assert keep.put("a", "A", 4) and keep.put("b", "B", 4)
    assert keep.get("a") == "A"  # a is now the most recent
    assert keep.put("c", "C", 4)  # 12 > 10: b goes
    assert "b" not in keep and keep.get("b") is None
    assert keep.get("a") == "A" and keep.get("c") == "C"
    assert keep.bytes == 8 and keep.counters.evicted == 1
    assert keep.counters.hits == 3 and keep.counters.misses == 1
    keep.check_valid()


def test_a_value_larger_than_the_limit_is_not_kept_unless_pinned() -> None:
    keep: ImageKeep[str, str] = ImageKeep(10)
    assert keep.put("a", "A", 4)
    assert not keep.put("big", "X", 11)
    assert "big" not in keep and keep.counters.refused == 1 and keep.get("a") == "A"
    assert keep.put("big", "X", 11, pinned=True)  # a turn's own picture: kept
    assert "big" in keep and "a" not in keep  # what could go, went
    keep.check_valid()
    keep.begin_turn()  # the pin lifted: over the limit, it goes
    assert "big" not in keep and keep.bytes == 0
    keep.check_valid()


def test_pins_last_pin_turns_turns() -> None:
    keep: ImageKeep[str, str] = ImageKeep(0, pin_turns=3)
    keep.put("p", "P", 5, pinned=True)
    keep.begin_turn()
    keep.begin_turn()
    assert "p" in keep  # pinned two turns ago, three turns pinned
    keep.begin_turn()
    assert "p" not in keep
    with pytest.raises(ValueError):
        ImageKeep(-1)
    with pytest.raises(ValueError):
        ImageKeep(1, pin_turns=0)


def test_putting_a_key_again_replaces_its_value_and_size() -> None:
    keep: ImageKeep[str, str] = ImageKeep(10)
    keep.put("a", "A", 4)
    keep.put("a", "A2", 6)
    assert keep.get("a") == "A2" and keep.bytes == 6 and len(keep) == 1
    keep.discard("a")
    keep.discard("a")
    assert keep.bytes == 0
    keep.check_valid()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 5), st.integers(0, 12), st.booleans()),
        st.tuples(st.just("get"), st.integers(0, 5)),
        st.tuples(
            st.just("turn"),
        ),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(0, 20), pin_turns=st.integers(1, 3), ops=OPS)
def test_the_keep_behaves_as_a_plain_model(limit: int, pin_turns: int, ops: list[tuple[object, ...]]) -> None:
    keep: ImageKeep[int, int] = ImageKeep(limit, pin_turns)
    model: OrderedDict[int, tuple[int, int | None]] = OrderedDict()  # key -> (size, turn pinned in)
    turn = 0

    def pinned(entry: tuple[int, int | None]) -> bool:
        return entry[1] is not None and turn - entry[1] < pin_turns

    def evict() -> None:
        for key in list(model):
            if sum(size for size, _ in model.values()) <= limit:
                return
            if not pinned(model[key]):
                del model[key]

    for op in ops:
        if op[0] == "put":
            _, key, size, pin = op
            model.pop(key, None)  # type: ignore[call-overload]
            kept = keep.put(key, key * 100, size, pinned=pin)  # type: ignore[arg-type]
            if size <= limit or pin:
                model[key] = (size, turn if pin else None)  # type: ignore[index]
                evict()
            assert kept == (size <= limit or bool(pin))
        elif op[0] == "get":
            key = op[1]
            got = keep.get(key)  # type: ignore[arg-type]
            assert (got is not None) == (key in model)
            if key in model:
                assert got == key * 100  # type: ignore[operator]
                model.move_to_end(key)  # type: ignore[arg-type]
        else:
            turn += 1
            keep.begin_turn()
            evict()
        keep.check_valid()
        assert keep.keys() == list(model) and len(keep) == len(model)
        assert keep.bytes == sum(size for size, _ in model.values())


def test_the_flag_sizes_the_keep_and_a_run_with_an_encoder_sets_it_aside() -> None:
    from pathlib import Path

    from bmoe.frontend.vision_options import vision_fields
    from bmoe.runtime.session_config import SessionConfig
    from bmoe.runtime.vision import image_cache_bytes
    from bmoe.serve.flags import build_parser

    default = build_parser().parse_args(["-m", "x.gguf"])
    assert vision_fields(default, None)["image_cache_mb"] == 64
    args = build_parser().parse_args(["-m", "x.gguf", "--image-cache-mb", "16"])
    fields = vision_fields(args, Path("/p/mmproj.gguf"))
    config = SessionConfig(model_path=Path("/p/x.gguf"), **fields)
    assert config.image_cache_mb == 16 and image_cache_bytes(config) == 16 << 20
    assert (
        image_cache_bytes(SessionConfig(model_path=Path("/p/x.gguf"), image_cache_mb=16)) == 0
    )  # no encoder
    with pytest.raises(ValueError, match="image_cache_mb"):
        SessionConfig(model_path=Path("/p/x.gguf"), image_cache_mb=-1)
