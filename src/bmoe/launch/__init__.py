"""``python -m bmoe.launch claude|codex|opencode``: a coding agent on bmoe."""
