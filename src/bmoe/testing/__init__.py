"""Helpers for bmoe's own tests and demos (tiny generated models in :mod:`bmoe.testing.fixtures`)."""
