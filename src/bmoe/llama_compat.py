"""llama-cpp-python's ``Llama`` API over a bmoe session: an app written against
``llama_cpp.Llama`` runs on bmoe by changing its constructor (docs/library.md).

``Llama(model_path=..., n_ctx=..., ...)`` opens a ``Session`` (experts streamed by default:
``moe_stream``, ``cache_mb``); ``create_completion`` (and ``__call__``) and
``create_chat_completion`` take llama-cpp-python's arguments and answer its dicts (OpenAI's
shapes: ``id``, ``object``, ``created``, ``model``, ``choices``, ``usage``), or with
``stream=True`` an iterator of its chunks. A chat request goes through the server's request
core: its body is read by ``bmoe.requests.api_requests`` (messages, tools, ``tool_choice``,
``response_format``, log-probabilities, penalties, ``logit_bias``), mapped by
``bmoe.requests.mapping``, its reply cut at stop strings and read for tool calls by
``bmoe.requests.reply.ReplyStream`` (run as ``Session.chat_stream`` runs it:
``bmoe.runtime.chat_requests.follow_reply``) and written by ``bmoe.serve.api_responses``, so
the library and the server answer one request alike.

What differs from llama-cpp-python: the prompt of a chat is rendered by the model's own
chat template (``chat_format`` is not used; a ``chat_handler`` only gives its
``clip_model_path``, the vision encoder, as ``mmproj=`` does: images come in
``image_url`` parts as llama-cpp-python takes them); ``min_p`` is not applied
(bmoe's sampler chain is llama.cpp's top-k, top-p, temperature); ``logprobs`` need no
``logits_all``; a prompt given as token ids, ``suffix``, and the samplers bmoe does not have
(``repeat_penalty``, ``typical_p``, ``tfs_z``, mirostat) or Python logits processors are
refused (``ConfigError``, a ``ValueError``) rather than silently changed.
"""

from __future__ import annotations

import os
import random
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs

from bmoe.adapters.llama.context import ContextParams
from bmoe.domain.chat import ChatMessage
from bmoe.domain.generation import GenerateRequest
from bmoe.domain.placement import Placement
from bmoe.domain.sampling import SamplingParams
from bmoe.domain.streaming import StreamConfig
from bmoe.errors import ConfigError, ContextOverflowError
from bmoe.requests.api_requests import SEED_MAX, parse_chat_completion, parse_completion
from bmoe.requests.mapping import ServeDefaults, chat_turn, completion_request
from bmoe.requests.neutral import Delta, Outcome
from bmoe.runtime import Session, SessionConfig
from bmoe.runtime.chat_requests import follow_reply
from bmoe.serve import api_responses
from bmoe.serve.api_responses import Envelope, Json

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
"""llama-cpp-python's default seed (llama.cpp's "pick one")."""

IGNORED = frozenset(
    {
        "use_mmap", "use_mlock", "numa", "no_perf", "last_n_tokens_size", "offload_kqv", "op_offload",
        "main_gpu", "split_mode", "tensor_split", "logits_all", "n_threads_batch", "chat_format",
    }
)  # fmt: skip
"""Constructor arguments accepted and not used: how llama.cpp maps and places memory, what
bmoe does without being asked (``logits_all``), or (``chat_format``) what the model's own
chat template does."""

NEUTRAL: dict[str, object] = {
    "vocab_only": False, "kv_overrides": None, "embedding": False, "lora_base": None, "lora_path": None,
    "lora_scale": 1.0, "draft_model": None, "tokenizer": None, "chat_handler": None, "type_k": None,
    "type_v": None, "spm_infill": False, "rope_scaling_type": -1, "pooling_type": -1,
    "attention_type": -1, "rope_freq_base": 0.0, "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0,
    "yarn_attn_factor": 1.0, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0,
}  # fmt: skip
"""Constructor arguments bmoe does not support, accepted only at llama-cpp-python's default."""


def _refuse_unless(name: str, value: object, neutral: object) -> None:
    if value is not None and value != neutral:
        raise ConfigError(f"bmoe's Llama does not support {name}={value!r} (only {neutral!r})", name)


def _stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """llama-cpp-python's ``stop``: a string or a list (empty strings skipped)."""
    items = [stop] if isinstance(stop, str) else list(stop or [])
    return tuple(s for s in items if s)


def _grammar(grammar: object) -> str | None:
    """A ``llama_cpp.LlamaGrammar`` (its GBNF text) or GBNF text."""
    if grammar is None or isinstance(grammar, str):
        return grammar
    text = getattr(grammar, "_grammar", None)
    if not isinstance(text, str):
        raise ConfigError("grammar must be a llama_cpp.LlamaGrammar or GBNF text", "grammar")
    return text


def _response_format(fmt: Any) -> Any:
    """llama-cpp-python's ``{"type": "json_object", "schema": {...}}`` as OpenAI's
    ``json_schema`` format; any other value as it is."""
    if isinstance(fmt, dict) and fmt.get("type") == "json_object" and isinstance(fmt.get("schema"), dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt["schema"]}}
    return fmt


def _sampling_body(
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    frequency_penalty: float,
    presence_penalty: float,
    logit_bias: dict[int, float] | None,
    repeat_penalty: float,
    typical_p: float,
    tfs_z: float,
    mirostat_mode: int,
    logits_processor: object,
    grammar: object,
) -> dict[str, Any]:
    """The sampling arguments both calls share, as a request body's fields (``min_p`` and
    mirostat's tau and eta are not among them: see the module's note)."""
    _refuse_unless("repeat_penalty", repeat_penalty, 1.0)
    _refuse_unless("typical_p", typical_p, 1.0)
    _refuse_unless("tfs_z", tfs_z, 1.0)
    _refuse_unless("mirostat_mode", mirostat_mode, 0)
    _refuse_unless("logits_processor", logits_processor, None)
    body: dict[str, Any] = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "grammar": _grammar(grammar),
    }
    if logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in logit_bias.items()}
    return body


class Llama:
    """llama-cpp-python's ``Llama`` over a bmoe ``Session`` (the ``session`` attribute).

    Takes llama-cpp-python's constructor arguments by their names (``n_ctx``, ``n_batch``,
    ``n_ubatch``, ``n_threads``, ``seed``, ``n_gpu_layers``, ``flash_attn``, ``verbose``; those
    in ``IGNORED`` accepted and unused, those in ``NEUTRAL`` only at their default) and
    bmoe's own: ``moe_stream`` (stream the experts from the file, default on), ``cache_mb``
    (the expert cache; ``None``: bmoe's rule), ``repack`` (llama.cpp's repacked weight
    layout, as stock). ``notes`` says what was ignored, and what the session says about
    how it runs (printed to stderr when ``verbose``). Close with ``close()`` or a ``with``.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        seed: int = LLAMA_DEFAULT_SEED,
        n_gpu_layers: int = 0,
        flash_attn: bool = False,
        verbose: bool = True,
        moe_stream: bool = True,
        cache_mb: int | None = None,
        repack: bool = True,
        mmproj: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.notes: list[str] = []
        handler = kwargs.pop("chat_handler", None)
        clip = getattr(handler, "clip_model_path", None)  # llama-cpp-python's Llava15ChatHandler & co.
        if handler is not None and clip is None:
            raise ConfigError(
                "chat_handler is not used by bmoe (a vision model takes mmproj=FILE)", "chat_handler"
            )
        if mmproj is None and clip is not None:
            mmproj = clip
        for name, value in kwargs.items():
            if name in IGNORED:
                if value is not None:
                    self.notes.append(f"llama_compat: {name} is not used by bmoe")
            elif name in NEUTRAL:
                _refuse_unless(name, value, NEUTRAL[name])
            else:
                raise TypeError(f"Llama() got an unexpected keyword argument {name!r}")
        if n_ctx <= 0:
            raise ConfigError("n_ctx 0 (the model's own) is not supported: give the context length", "n_ctx")
        context = ContextParams(
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=min(n_ubatch, n_batch),
            flash_attn="on" if flash_attn else "off",
        )
        if n_threads is not None and n_threads > 0:  # else bmoe's default: one per physical core
            context = attrs.evolve(context, n_threads=n_threads)
        config = SessionConfig(
            model_path=Path(model_path),
            context=context,
            verbose=verbose,
            stream=StreamConfig(enabled=moe_stream, cache_mb=cache_mb),
            repack=repack,
            placement=Placement(n_gpu_layers=n_gpu_layers),
            mmproj=Path(mmproj) if mmproj is not None else None,
        )
        self.model_path = str(model_path)
        self.verbose = verbose
        self._seed = seed if 0 <= seed <= SEED_MAX else random.randrange(SEED_MAX + 1)
        self.session = Session.open(config)
        self.notes += self.session.notes
        if verbose:
            for note in self.notes:
                print(note, file=sys.stderr)

    # -- llama-cpp-python's calls --------------------------------------------------------

    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: object = None,
        logits_processor: object = None,
        grammar: object = None,
        logit_bias: dict[int, float] | None = None,
    ) -> Json | Iterator[Json]:
        """A text completion of ``prompt`` (raw text, from an empty context): a
        ``text_completion`` dict, or with ``stream`` an iterator of its chunks (the last
        with ``finish_reason``). ``echo`` puts the prompt before the text."""
        if not isinstance(prompt, str):
            raise ConfigError("a prompt of token ids is not supported: give text", "prompt")
        _refuse_unless("suffix", suffix, None)
        _refuse_unless("stopping_criteria", stopping_criteria, None)
        if echo and logprobs is not None:
            raise ConfigError("echo with logprobs is not supported (the prompt's are not computed)", "echo")
        body = {
            "prompt": prompt,
            "logprobs": logprobs,
            **_sampling_body(
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                seed=seed,
                frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty,
                logit_bias=logit_bias,
                repeat_penalty=repeat_penalty,
                typical_p=typical_p,
                tfs_z=tfs_z,
                mirostat_mode=mirostat_mode,
                logits_processor=logits_processor,
                grammar=grammar,
            ),
        }
        request = completion_request(parse_completion(body), self._defaults)
        request = self._fit(request, max_tokens, None, chat=False)
        env = Envelope(f"cmpl-{uuid.uuid4()}", int(time.time()), model or self.model_path)
        items = follow_reply(self.session, request, _stops(stop), None, chat=False)
        if stream:
            return self._completion_chunks(env, items, prompt, echo=echo)
        outcome = _last(items)
        if echo:
            outcome = attrs.evolve(outcome, text=prompt + outcome.text)
        answer = api_responses.text_completion(env, outcome)
        # offsets into the prompt and the text, as llama-cpp-python (and OpenAI) count them
        answer["choices"][0]["logprobs"] = api_responses.text_logprobs(outcome.logprobs, len(prompt))
        return answer

    __call__ = create_completion

    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        functions: object = None,
        function_call: object = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: object = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        response_format: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: object = None,
        grammar: object = None,
        logit_bias: dict[int, float] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
    ) -> Json | Iterator[Json]:
        """A chat completion of ``messages`` (OpenAI's shapes; tools, ``tool_choice`` and
        ``response_format`` as the server takes them): a ``chat.completion`` dict, or with
        ``stream`` an iterator of ``chat.completion.chunk`` dicts (the first with the
        role, the last with ``finish_reason``). The context keeps the longest prefix it
        shares with the previous request's, as the server does."""
        body = {
            "messages": messages,
            "functions": functions,
            "function_call": function_call,
            "tools": tools,
            "tool_choice": tool_choice,
            "response_format": _response_format(response_format),
            "logprobs": logprobs,
            "top_logprobs": top_logprobs,
            **_sampling_body(
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                seed=seed,
                frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty,
                logit_bias=logit_bias,
                repeat_penalty=repeat_penalty,
                typical_p=typical_p,
                tfs_z=tfs_z,
                mirostat_mode=mirostat_mode,
                logits_processor=logits_processor,
                grammar=grammar,
            ),
        }
        turn = chat_turn(parse_chat_completion(body), self._defaults)
        request = self._fit(turn.request, max_tokens, turn.history, chat=True)
        env = Envelope(f"chatcmpl-{uuid.uuid4()}", int(time.time()), model or self.model_path)
        items = follow_reply(self.session, request, _stops(stop), turn.history, chat=True)
        if stream:
            return self._chat_chunks(env, items)
        return api_responses.chat_completion(env, _last(items))

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """``text``'s token ids (llama-cpp-python's ``tokenize``: UTF-8 bytes in)."""
        return self.session.model.tokenize(text.decode("utf-8"), add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """The bytes ``tokens`` stand for (specials' text only with ``special``)."""
        return b"".join(self.session.model.token_bytes(t, special=special) for t in tokens)

    def n_ctx(self) -> int:
        """The context length."""
        return self.session.n_ctx

    # -- the session underneath ----------------------------------------------------------

    @property
    def _defaults(self) -> ServeDefaults:
        return ServeDefaults(sampling=SamplingParams(seed=self._seed))

    def _fit(
        self,
        request: GenerateRequest,
        max_tokens: int | None,
        history: Sequence[ChatMessage] | None,
        *,
        chat: bool,
    ) -> GenerateRequest:
        """``max_tokens`` as llama-cpp-python reads it: ``None`` or <= 0 until the context
        is full, and never past it (a prompt that fills the context is refused)."""
        n_prompt = len(self.session.engine.render_prompt(request, history=history, chat=chat))
        room = self.session.n_ctx - n_prompt
        if room <= 0:
            raise ContextOverflowError(
                f"Requested tokens ({n_prompt}) exceed context window of {self.session.n_ctx}"
            )
        n_predict = room if max_tokens is None or max_tokens <= 0 else min(max_tokens, room)
        return attrs.evolve(request, n_predict=n_predict)

    @staticmethod
    def _completion_chunks(
        env: Envelope, items: Iterator[Delta | Outcome], prompt: str, *, echo: bool
    ) -> Iterator[Json]:
        """The chunks of a streamed completion (the prompt first with ``echo``)."""
        echoed = prompt if echo else ""
        if echoed:
            yield api_responses.text_chunk(env, Delta(echoed))
        offset = len(prompt)
        for item in items:
            if isinstance(item, Outcome):
                yield api_responses.text_chunk(env, Delta(), item.finish_reason)
                return
            logprobs = api_responses.text_logprobs(item.logprobs, offset) if item.logprobs else None
            offset += len(item.text)
            yield api_responses.text_chunk(env, item, logprobs=logprobs)

    @staticmethod
    def _chat_chunks(env: Envelope, items: Iterator[Delta | Outcome]) -> Iterator[Json]:
        """The chunks of a streamed chat completion: the role first, the reason last."""
        yield api_responses.chat_chunk(env, {"role": "assistant"})
        calls = 0
        for item in items:
            if isinstance(item, Outcome):
                yield api_responses.chat_chunk(env, {}, item.finish_reason)
                return
            logprobs = api_responses.chat_logprobs(item.logprobs) if item.logprobs else None
            yield api_responses.chat_chunk(env, api_responses.chat_delta(item, calls), logprobs=logprobs)
            calls += len(item.tool_calls)

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Free the model and the context now (idempotent)."""
        self.session.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _last(items: Iterable[Delta | Outcome]) -> Outcome:
    """The outcome after a reply's pieces (which a whole answer does not need)."""
    outcome = None
    for item in items:
        if isinstance(item, Outcome):
            outcome = item
    if outcome is None:
        raise AssertionError("a reply ends with its outcome")
    return outcome
