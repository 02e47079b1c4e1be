"""A streamed session's usage profile at work (``--profile``; the policy is
:mod:`bmoe.domain.streaming.usage_profile`, the file :mod:`bmoe.adapters.usage_profile_file`).

At open, the profile learned by earlier processes (if any, and trusted) warms the cache: the
hottest entries are queued on the lanes as committed reads ahead, in file order, and the
first request adopts what it routes to (it never waits for the rest). After every
``save_every`` requests and at close, the routing this process counted since its last save
is merged into the file (decayed, under the file's lock: processes sharing a profile add
up). A profile that cannot be read or written costs a line in ``notes``, never a request;
a disk that fails (full, read-only) is one warning line, and the keeper backs off and tries
again later (``bmoe.adapters.file_writes.CacheWrites``), saying when writes work again.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bmoe.adapters.file_writes import CacheWrites
from bmoe.adapters.usage_profile_file import read_profile, update_profile
from bmoe.domain.streaming.usage_profile import (
    ProfileRejected,
    UsageProfile,
    WarmSet,
    merge,
    routed_tokens,
    warm_set,
)
from bmoe.errors import FileNotKeptError
from bmoe.runtime.streaming import StreamingControl

MIB = 1024 * 1024
SNAPSHOT_WAIT_S = 60.0


class ProfileKeeper:
    """Learns into ``path`` what ``control``'s session routes; ``k``: experts per token."""

    def __init__(
        self,
        control: StreamingControl,
        path: Path,
        key: str,
        k: int,
        *,
        save_every: int = 8,
    ) -> None:
        streamer = control.streaming.streamer
        self.control = control
        self.path = path
        self.key = key
        self.k = k
        self.n_layer = int(streamer.n_layer)
        self.n_expert = int(streamer.n_expert)
        self.save_every = save_every
        self.notes: list[str] = []
        self.warmed: WarmSet | None = None
        self._requests = 0
        self._saved: tuple[int, ...] = (0,) * (self.n_layer * self.n_expert)  # all 0 until a merge
        self._broken = False  # writing failed once, not for the disk's sake: stop trying
        self.writes = CacheWrites(self._warn)  # the disk's faults: warn once, back off

    def _warn(self, line: str) -> None:
        """A line about the disk: in ``notes``, and on stderr when it happens (mid-run)."""
        self.notes.append(line)
        print(line, file=sys.stderr, flush=True)

    def warm(self, share: float) -> WarmSet | None:
        """Read the profile and queue its warm set (nothing without a trusted profile or a
        cache). Returns what was queued."""
        try:
            profile = read_profile(self.path, self.key, self.n_layer, self.n_expert)
        except ProfileRejected as why:
            self.notes.append(f"moe-profile: ignored {self.path}: {why}")
            return None
        except OSError as exc:
            self.notes.append(f"moe-profile: cannot read {self.path}: {exc.strerror or exc}")
            return None
        if profile is None:
            self.notes.append(f"moe-profile: none yet at {self.path}: learning from this session")
            return None
        streamer = self.control.streaming.streamer
        sizes = [int(streamer.entry_bytes(layer)) for layer in range(self.n_layer)]
        budget = self.control.counters().budget_bytes
        chosen = warm_set(profile, sizes, budget, self.control.info.token_cycle_bytes, share)
        if chosen.entries == 0:
            self.notes.append(f"moe-profile: {self.path}: nothing to warm within the cache")
            return None
        self.control.read_ahead([(layer, list(experts)) for layer, experts in chosen.targets])
        self.warmed = chosen
        self.notes.append(
            f"moe-profile: warming {chosen.entries} experts ({chosen.bytes / MIB:.0f} MiB, "
            f"{chosen.share:.0%} of the routing of {profile.tokens:.0f} tokens, "
            f"{profile.sessions} session{'' if profile.sessions == 1 else 's'}) from {self.path}"
        )
        return chosen

    def after_request(self) -> None:
        """Count a request; every ``save_every``, merge."""
        self._requests += 1
        if self.save_every > 0 and self._requests % self.save_every == 0:
            self.save()

    def save(self) -> UsageProfile | None:
        """Merge the routing counted since the last save into the file (nothing new: no
        write). Returns the merged profile, None when nothing was written."""
        if self._broken:
            return None
        snap = self.control.snapshot(SNAPSHOT_WAIT_S)
        if snap is None:
            return None
        now = snap.routed
        delta = [max(0, a - b) for a, b in zip(now, self._saved, strict=True)]
        if not any(delta):
            return None
        if not self.writes.may_try():  # backing off a disk that failed: the news waits for the next save
            return None
        tokens = routed_tokens(delta, self.n_layer, self.n_expert, self.k)
        first = not any(self._saved)  # this process's first merge
        try:
            merged, replaced = update_profile(
                self.path,
                self.key,
                self.n_layer,
                self.n_expert,
                lambda p: merge(p, delta, tokens, new_session=first),
            )
        except FileNotKeptError as exc:  # the disk's fault: one line, then back off and try again later
            self.writes.failed(exc)
            return None
        except OSError as exc:
            self._broken = True
            self.notes.append(f"moe-profile: cannot write {self.path}: {exc.strerror or exc}")
            return None
        self.writes.worked(self.path.parent)
        if replaced is not None:
            self.notes.append(f"moe-profile: replaced {self.path} ({replaced})")
        self._saved = now
        return merged
