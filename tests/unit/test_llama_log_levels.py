"""llama.cpp's log: errors are shown (level 4 in this ggml; 3 is a warning), except the lines
an aborted decode logs, which bmoe reports itself; everything when verbose."""

from __future__ import annotations

from bmoe.adapters.llama import log


def test_errors_are_shown_warnings_and_abort_noise_are_not() -> None:
    log.set_llama_verbose(False)
    assert log.shown(4, b"llama_model_load: error loading model: tensor 'x' not found\n")
    assert not log.shown(3, b"decode: removing memory module entries for seq_id = 0, pos = [5, +inf)\n")
    assert not log.shown(2, b"llama_context: n_ctx = 512\n")
    for line in (
        b"graph_compute: ggml_backend_sched_graph_compute_async failed with error 1\n",
        b"process_ubatch: failed to compute graph, compute status: 1\n",
        b"llama_decode: failed to decode, ret = 2\n",
    ):
        assert not log.shown(4, line)
    assert log.shown(4, b"llama_decode: failed to decode, ret = -3\n")  # not an abort: shown


def test_verbose_shows_everything() -> None:
    log.set_llama_verbose(True)
    try:
        assert log.shown(2, b"llama_context: n_ctx = 512\n")
    finally:
        log.set_llama_verbose(False)
