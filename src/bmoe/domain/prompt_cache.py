"""The prompt cache (``--cache-ram MiB``, llama.cpp's flag): conversations' states kept in
host memory, so a conversation that comes back costs only its new tokens.

A context holds one conversation's KV at a time. When a request's prompt does not continue
what the context holds (another conversation: an agent and its subagent, two editor windows,
a chat beside a background job), the context's state is saved here first, keyed by the
tokens it holds; a later request whose prompt extends kept tokens restores that state
(``llama_state_seq_set_data``: bit for bit what was saved) and prefills only the rest.

Rules:

- **Which state**: the kept state sharing the longest prefix with the prompt, that prefix
  leaving at least the prompt's last token to prefill (its logits are what the reply is
  sampled from); used only where it keeps more than the context already does. A state
  usually shares less than all its tokens: a chat template renders an earlier reply other
  than the tokens generated (a thinking block dropped, an end token added), so the state is
  restored and then cut back to the shared prefix (a memory that cannot be cut, recurrent
  state, uses only a state the prompt extends whole).
- **One state per conversation**: keeping a state drops the kept ones whose tokens are a
  prefix of its own (the same conversation, earlier); they are superseded.
- **Room**: at most ``limit_bytes`` (None: no limit); the least recently used states go
  first. A state bigger than the limit alone is not kept. ``set_limit`` moves the limit
  (memory pressure lowers it) and drops what no longer fits: a state is dropped whole, never
  half kept.
- **A slower tier** (``spill``, the disk tier of ``--cache-disk``): a state that leaves
  memory for room goes there instead of being lost; a lookup weighs its states with the ones
  in memory, and one it picks is read back (into memory, most recently used). A state the
  tier refuses to give back (corrupt, another model's: the tier says why) is never
  restored; the lookup goes on without it. ``persist`` writes every state held in memory
  there too (at close: a restarted process finds them).

Pure: the blobs are opaque here (the backend made them and only the backend reads them).
Safe to share between threads (a lock guards the states): the memory governor's thread
lowers the limit while a request may be using the cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from bmoe.domain.decide.prefix_cache import KeptState, StateBlob
from bmoe.domain.kv_reuse import common_prefix_len, extends

MIB = 1024 * 1024
DEFAULT_CACHE_RAM_MIB = 512
"""``--cache-ram``'s default on the command line and the server (llama.cpp's server keeps
8192): room for a few long conversations on a small machine. The library's default is off
(``SessionConfig.cache_ram_mb``)."""


def cache_ram_bytes(mib: int) -> int | None:
    """``--cache-ram`` in bytes: 0 off, -1 no limit (None), else MiB."""
    if mib < -1:
        raise ValueError(f"--cache-ram takes MiB, 0 (off) or -1 (no limit), not {mib}")
    return None if mib == -1 else mib * MIB


def memory_tier_bytes(mib: int, state_bytes: int) -> int:
    """What the prompt cache's memory tier may come to hold (``--cache-mb auto`` sets it
    aside): ``--cache-ram`` in bytes; where unlimited (-1), one whole context's state
    (``state_bytes``, the KV cache), the least it holds once a conversation is kept."""
    limit = cache_ram_bytes(mib)
    return max(0, state_bytes) if limit is None else limit


@attrs.define
class PromptCacheCounters:
    """Cumulative counts since the cache was made."""

    stored: int = 0  # states kept
    restored: int = 0  # states a prompt continued from
    tokens_restored: int = 0  # prompt tokens those states spared the prefill
    evicted: int = 0  # states dropped for room (the limit, or a lower one)
    superseded: int = 0  # states dropped because a longer state of their conversation came
    refused: int = 0  # states bigger than the limit alone: not kept
    spilled: int = 0  # states given to the slower tier: pushed out of memory (counted in evicted
    # too), or too big for it
    unspilled: int = 0  # states read back from the slower tier for a restore
    refused_spilled: int = 0  # states the slower tier refused to give back (corrupt, foreign)


class StateSpill(Protocol):
    """A slower tier for kept states (the disk tier): it keeps what it is given within its
    own room, and may lose a state at any time (another process, its limit, a bad file)."""

    def held(self) -> list[tuple[int, ...]]:
        """The token sequences it holds a state for (cheap: no reading)."""
        ...

    def put(self, tokens: tuple[int, ...], blob: StateBlob) -> None:
        """Keep ``blob`` as the state after ``tokens`` (replacing one with the same tokens).
        Never raises for the disk's sake: a state it cannot write is not kept (and said once)."""
        ...

    def take(self, tokens: tuple[int, ...]) -> StateBlob | None:
        """The state after ``tokens``, checked whole; None where it is gone or refused
        (a refused one is removed and said why)."""
        ...

    def drop(self, tokens: tuple[int, ...]) -> None:
        """Forget the state after ``tokens``, if held."""
        ...


@attrs.frozen
class StateTarget:
    """Where a kept state goes: ``load`` puts a blob there (False: refused, the target left
    empty), ``cut`` keeps its first tokens (False: the memory cannot be cut), ``empty``
    forgets what it holds."""

    load: Callable[[StateBlob], bool]
    cut: Callable[[int], bool]
    empty: Callable[[], None]


@attrs.frozen
class Restore:
    """Restore ``kept``, then keep its first ``shared`` tokens (all of them, or cut back)."""

    kept: KeptState
    shared: int

    @property
    def cut(self) -> bool:
        return self.shared < len(self.kept.tokens)


class PromptCache:
    """Kept states of conversations, least recently used first, within ``limit_bytes``."""

    def __init__(self, limit_bytes: int | None, spill: StateSpill | None = None) -> None:
        if limit_bytes is not None and limit_bytes < 0:
            raise ValueError("the prompt cache's limit must be >= 0 bytes (None: no limit)")
        self.limit_bytes = limit_bytes
        self.spill = spill
        self._states: OrderedDict[tuple[int, ...], KeptState] = OrderedDict()
        self._last_stored: tuple[int, ...] = ()
        self.counters = PromptCacheCounters()
        self._lock = threading.RLock()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(kept.nbytes for kept in self._states.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._states)

    def kept(self) -> list[KeptState]:
        """The kept states, least recently used first."""
        with self._lock:
            return list(self._states.values())

    def lookup(self, prompt: Sequence[int], better_than: int = 0, *, whole: bool = False) -> Restore | None:
        """The kept state sharing the longest prefix with ``prompt`` (at most all but its
        last token) when that prefix is longer than ``better_than`` (what the context
        already holds), marked as just used; None where there is none. ``whole``: only
        states the prompt extends whole (a memory that cannot be cut back). A state of the
        slower tier is read back into memory first; one it refuses is passed over."""
        prompt = tuple(prompt)
        with self._lock:
            while True:
                best = self._best(prompt, better_than, whole)
                if best is None:
                    return None
                tokens, shared = best
                if tokens in self._states:
                    self._states.move_to_end(tokens)
                    return Restore(self._states[tokens], shared)
                state = self._unspill(tokens)
                if state is not None:
                    return Restore(state, shared)

    def _best(
        self, prompt: tuple[int, ...], better_than: int, whole: bool
    ) -> tuple[tuple[int, ...], int] | None:
        """The tokens of the state (in memory first, then in the slower tier) sharing the
        longest prefix with ``prompt``, and that prefix (the lock held)."""
        best: tuple[tuple[int, ...], int] | None = None
        spilled = self.spill.held() if self.spill is not None else []
        for tokens in [*self._states, *spilled]:
            shared = min(common_prefix_len(tokens, prompt), len(prompt) - 1)
            if whole and shared < len(tokens):
                continue
            if shared > better_than and (best is None or shared > best[1]):
                best = (tokens, shared)
        return best

    def _unspill(self, tokens: tuple[int, ...]) -> KeptState | None:
        """Read the state after ``tokens`` back from the slower tier into memory (most
        recently used; only lent to the caller where it does not fit); None, counted, where
        the tier refuses it (the lock held)."""
        assert self.spill is not None
        blob = self.spill.take(tokens)
        if blob is None:
            self.counters.refused_spilled += 1
            self.spill.drop(tokens)  # gone or refused: never offered again
            return None
        self.counters.unspilled += 1
        state = KeptState(tokens, blob)
        if self.limit_bytes is None or state.nbytes <= self.limit_bytes:
            self._states[tokens] = state
            self._fit()
        return state

    def restored(self, restore: Restore) -> None:
        """``restore`` was carried out: count it."""
        with self._lock:
            self.counters.restored += 1
            self.counters.tokens_restored += restore.shared

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether a state is kept for exactly ``tokens``."""
        with self._lock:
            return tuple(tokens) in self._states

    def store(self, tokens: Sequence[int], blob: StateBlob) -> bool:
        """Keep ``blob`` as the state after ``tokens`` (most recently used), dropping the
        states it supersedes and then, least recently used first, what no longer fits.
        A state bigger than the limit alone goes to the slower tier where there is one;
        False (nothing kept, nothing dropped) where there is none."""
        key = tuple(tokens)
        if not key:
            raise ValueError("a kept state needs at least one token")
        state = KeptState(key, blob)
        with self._lock:
            too_big = self.limit_bytes is not None and state.nbytes > self.limit_bytes
            if too_big and self.spill is None:
                self.counters.refused += 1
                return False
            for old in [k for k in self._states if extends(key, k)]:
                del self._states[old]
                if old != key:
                    self.counters.superseded += 1
            if self.spill is not None:  # the tier's earlier states of this conversation too
                for old in [k for k in self.spill.held() if k != key and extends(key, k)]:
                    self.spill.drop(old)
            self._last_stored = key
            self.counters.stored += 1
            if too_big and self.spill is not None:  # too big for memory: straight to the tier
                self.spill.put(key, blob)
                self.counters.spilled += 1
                return True
            self._states[key] = state
            self._fit()
            return True

    def discard(self, tokens: Sequence[int]) -> None:
        """Forget the state kept for exactly ``tokens`` (e.g. it failed to load)."""
        with self._lock:
            self._states.pop(tuple(tokens), None)
            if self.spill is not None:
                self.spill.drop(tuple(tokens))

    def restore(self, found: Restore, prompt: Sequence[int], target: StateTarget) -> Restore | None:
        """Carry out ``found`` (a ``lookup`` for ``prompt``) into ``target``: load its state
        and cut it back to what the prompt shares; where the memory cannot be cut
        (recurrent), a state the prompt extends whole instead. Returns the restore carried
        out (counted), or None: ``target`` is empty (a refused state is forgotten)."""
        done = self._load(found, target)
        if not done and found.cut:
            whole = self.lookup(prompt, whole=True)
            done = whole is not None and self._load(whole, target)
            found = whole if whole is not None else found
        if not done:
            return None
        self.restored(found)
        return found

    def _load(self, found: Restore, target: StateTarget) -> bool:
        if not target.load(found.kept.blob):
            self.discard(found.kept.tokens)
            return False
        if found.cut and not target.cut(found.shared):
            target.empty()
            return False
        return True

    def set_limit(self, limit_bytes: int | None) -> int:
        """A new limit (memory pressure lowers it, freed memory gives it back); drops, least
        recently used first, what no longer fits. Returns the bytes given back."""
        if limit_bytes is not None and limit_bytes < 0:
            raise ValueError("the prompt cache's limit must be >= 0 bytes (None: no limit)")
        with self._lock:
            before = self.nbytes
            self.limit_bytes = limit_bytes
            self._fit()
            return before - self.nbytes

    def clear(self) -> None:
        """Forget the states held in memory (the slower tier keeps its own)."""
        with self._lock:
            self._states.clear()

    def persist(self) -> int:
        """Give every state held in memory to the slower tier too (at close); how many."""
        with self._lock:
            if self.spill is None:
                return 0
            for tokens, state in self._states.items():
                self.spill.put(tokens, state.blob)
            return len(self._states)

    def _fit(self) -> None:
        """Drop least recently used states until within the limit, into the slower tier
        where there is one (the lock held)."""
        while self.limit_bytes is not None and self._states and self.nbytes > self.limit_bytes:
            tokens, state = self._states.popitem(last=False)
            self.counters.evicted += 1
            if self.spill is not None:
                self.spill.put(tokens, state.blob)
                self.counters.spilled += 1

    def check_valid(self) -> None:
        """Assert the invariants (for tests)."""
        with self._lock:
            keys = list(self._states)
            assert all(key == self._states[key].tokens and key for key in keys)
            assert self.limit_bytes is None or self.nbytes <= self.limit_bytes
            # the state stored last superseded its conversation's earlier ones
            last = self._last_stored
            assert not any(k != last and extends(last, k) for k in keys)


def follow_budget(cache: PromptCache, configured: int | None, before: int, after: int) -> int:
    """The memory governor moved the expert cache's budget from ``before`` to ``after``
    bytes: a shrink lowers the prompt cache's limit by as much below what it holds (its
    states go before the expert cache feels the pressure twice), a growth gives back the
    ``configured`` limit. Returns the bytes given back."""
    if after < before:
        return cache.set_limit(max(0, cache.nbytes - (before - after)))
    return cache.set_limit(configured)
