"""The fixtures' BPE tokenizer and chat template, in pure Python (no llama.cpp)."""

from __future__ import annotations

from gguf import TokenType

from bmoe.testing.fixtures import CHAT_TEMPLATE, build_vocab, decode, encode, render_chat
from bmoe.tinymodel.tokenizer import (
    END_THINK,
    ENDOFTEXT,
    IM_END,
    IM_START,
    N_MERGES,
    THINK,
    bytes_to_unicode,
    pretokenize,
    train_bpe,
)


def test_vocab_has_256_byte_tokens_then_merges_then_specials() -> None:
    vocab = build_vocab()
    assert set(vocab.tokens[:256]) == set(bytes_to_unicode().values())
    assert len(vocab.merges) == N_MERGES
    assert vocab.size == 256 + N_MERGES + 5
    assert vocab.tokens[256 : 256 + N_MERGES] == tuple(a + b for a, b in vocab.merges)


def test_special_token_types_follow_qwen3() -> None:
    vocab = build_vocab()
    texts = (ENDOFTEXT, IM_START, IM_END, THINK, END_THINK)
    kinds = {text: vocab.token_types[vocab.token_id(text)] for text in texts}
    assert kinds == {
        ENDOFTEXT: TokenType.CONTROL,
        IM_START: TokenType.CONTROL,
        IM_END: TokenType.CONTROL,
        THINK: TokenType.USER_DEFINED,
        END_THINK: TokenType.USER_DEFINED,
    }


def test_bpe_training_merges_the_most_frequent_pair_first_ties_in_string_order() -> None:
    text = "the cat the hat the mat"  # "at" and "he" both occur 3 times
    assert train_bpe(text, 3) == [("a", "t"), ("h", "e"), ("t", "he")]
    assert train_bpe(text, 10) == train_bpe(text, 10)


def test_space_prefixed_common_words_are_single_tokens() -> None:
    vocab = build_vocab()
    for word in (" the", " world", " and", "Hello"):
        assert len(encode(word)) == 1, word
    assert vocab.tokens[encode(" the")[0]] == "Ġthe"


def test_a_merge_spans_the_join_of_two_strings() -> None:
    assert encode("Hello wor") + encode("ld") != encode("Hello world")
    assert decode(encode("Hello wor") + encode("ld")) == "Hello world"


def test_encode_decode_round_trips_any_bytes() -> None:
    for text in ("Hello, world!\n\n  x", "naïve café ☕", "tabs\tand 3.14 and 2024", ""):
        assert decode(encode(text)) == text


def test_control_tokens_are_parsed_only_when_asked_but_think_always() -> None:
    vocab = build_vocab()
    assert encode(IM_START, parse_special=True) == [vocab.token_id(IM_START)]
    assert len(encode(IM_START)) > 1
    assert encode(THINK) == [vocab.token_id(THINK)]


def test_pretokenizer_splits_like_qwen2() -> None:
    assert pretokenize("Hello world's 123 ok!!\n\nbye") == [
        "Hello",
        " world",
        "'s",
        " ",
        "1",
        "2",
        "3",
        " ok",
        "!!\n\n",
        "bye",
    ]


MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nHello!"},
    {"role": "user", "content": "Again"},
]


def test_chat_template_renders_chatml_and_strips_past_reasoning() -> None:
    assert render_chat(MESSAGES) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nAgain<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_closes_an_empty_think_block_when_thinking_is_off() -> None:
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert render_chat(MESSAGES, enable_thinking=False).endswith(closed)
    assert render_chat(MESSAGES, enable_thinking=True).endswith("<|im_start|>assistant\n")


def test_chat_template_without_generation_prompt_ends_after_last_turn() -> None:
    assert render_chat(MESSAGES, add_generation_prompt=False).endswith("<|im_start|>user\nAgain<|im_end|>\n")
    assert "{%" in CHAT_TEMPLATE
