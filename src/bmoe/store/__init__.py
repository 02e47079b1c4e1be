"""``python -m bmoe.store``: write a model's expert store (docs/streaming.md, "The expert store")."""
