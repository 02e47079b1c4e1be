"""Use cases: policy run over ports (no adapter imported here; ``bmoe.runtime`` wires them)."""
