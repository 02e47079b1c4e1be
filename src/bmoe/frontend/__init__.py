"""The front end the two commands share, ``python -m bmoe.cli`` and ``python -m bmoe.serve``:

- ``flags``: the argparse groups both parsers add (model, context and placement, expert
  streaming, decisions, a run's sampling and thinking);
- ``configs``: those flags read into settings, and ``session_config``, the one function
  that builds a ``SessionConfig`` from parsed flags;
- ``devices``: ``--list-devices``, which prints.

A layer of its own (import-linter, pyproject.toml): above ``bmoe.runtime``, imported by
``bmoe.cli`` and ``bmoe.serve`` only.
"""
