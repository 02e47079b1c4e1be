"""Copy drafts: tokens proposed from the request's own context, verified in one batch
(``copy_drafter``: what to propose; ``draft_gate``: whether proposing pays here)."""

from bmoe.domain.drafting.copy_drafter import CopyDrafter, DraftPolicy, accepted_prefix
from bmoe.domain.drafting.draft_gate import DraftGate, DraftReport

__all__ = ["CopyDrafter", "DraftGate", "DraftPolicy", "DraftReport", "accepted_prefix"]
