"""The expert store's policy (``bmoe.domain.expert_store``): the layout keeps every slice's
offset congruent with its model-file offset modulo a page, the refusals name their reason,
the sampled slices spread over the tensors, the manifest survives its document."""

from __future__ import annotations

import itertools

import pytest

from bmoe.domain.expert_store import (
    PAGE,
    SAMPLED_TENSORS,
    ManifestRejected,
    SourceTensor,
    from_document,
    lay_out,
    manifest_for,
    refusal,
    sample_slices,
    to_document,
)

SOURCES = [
    SourceTensor("blk.0.ffn_gate_exps.weight", 0, 6_304, 8 * 36_864),
    SourceTensor("blk.0.ffn_up_exps.weight", 0, 6_304 + 8 * 36_864, 8 * 36_864),
    SourceTensor("blk.1.ffn_down_exps.weight", 1, 1_000, 8 * 40_000),
]


def test_each_tensor_sits_congruent_with_its_model_file_offset_in_order_without_overlap() -> None:
    tensors, size = lay_out(SOURCES)
    assert [t.name for t in tensors] == [s.name for s in SOURCES]
    for t, src in zip(tensors, SOURCES, strict=True):
        assert t.store_offset % PAGE == src.offset % PAGE
        assert t.n_bytes == src.n_bytes and t.source_offset == src.offset and t.file_index == src.file_index
    for before, after in itertools.pairwise(tensors):
        assert before.end <= after.store_offset < before.end + PAGE
    assert size % PAGE == 0 and tensors[-1].end <= size < tensors[-1].end + PAGE


def manifest():
    return manifest_for(SOURCES, "model-key", "lib-key")


def test_a_store_that_serves_has_no_refusal() -> None:
    m = manifest()
    assert (
        refusal(m, model_key="model-key", library_key="lib-key", sources=SOURCES, store_size=m.store_bytes)
        == ""
    )
    # a model tensor the store lacks (not repacked here) is read from the model file
    extra = [*SOURCES, SourceTensor("blk.1.ffn_gate_exps.weight", 1, 400_000, 8 * 36_864)]
    assert (
        refusal(m, model_key="model-key", library_key="lib-key", sources=extra, store_size=m.store_bytes)
        == ""
    )


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"model_key": "other"}, "another model file"),
        ({"library_key": "other"}, "another llama.cpp build"),
        ({"store_size": 4096}, "cut or replaced"),
        ({"sources": SOURCES[:2]}, "not a routed-expert tensor of this model"),
        (
            {"sources": [SOURCES[0], SOURCES[1], SourceTensor(SOURCES[2].name, 1, 2_000, 8 * 40_000)]},
            "not the model's",
        ),
    ],
)
def test_refusals_name_their_reason(change: dict, why: str) -> None:
    m = manifest()
    args = {
        "model_key": "model-key",
        "library_key": "lib-key",
        "sources": SOURCES,
        "store_size": m.store_bytes,
    }
    assert why in refusal(m, **{**args, **change})


def test_another_format_is_refused() -> None:
    m = from_document({**to_document(manifest()), "version": 99})
    assert "store format" in refusal(
        m, model_key="model-key", library_key="lib-key", sources=SOURCES, store_size=m.store_bytes
    )


def test_the_sampled_slices_take_the_first_and_last_tensor_and_spread_the_experts() -> None:
    names = [f"blk.{i}.ffn_up_exps.weight" for i in range(40)]
    m = manifest_for([SourceTensor(n, 0, i * 8 * 4096, 8 * 4096) for i, n in enumerate(names)], "k", "l")
    picks = sample_slices(m, names, 8)
    assert len(picks) == SAMPLED_TENSORS
    assert picks[0][0].name == names[0] and picks[-1][0].name == names[-1]
    assert len({e for _, e in picks}) > 1 and all(0 <= e < 8 for _, e in picks)
    assert sample_slices(m, ["not.there"], 8) == []
    assert len(sample_slices(m, names[:3], 8)) == 3


def test_the_manifest_survives_its_document_and_a_bad_one_is_rejected() -> None:
    m = manifest()
    assert from_document(to_document(m)) == m
    assert m.tensor_at(m.tensors[1].store_offset + 5) == SOURCES[1].name and m.tensor_at(m.store_bytes) == ""
    with pytest.raises(ManifestRejected):
        from_document({"tensors": [{"name": "x"}]})
