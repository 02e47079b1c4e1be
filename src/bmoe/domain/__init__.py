"""Pure policy: value classes and decisions over tokens and numbers.

Nothing here does I/O or imports llama.cpp, the ports, the adapters or the C extension
(an import-linter contract in pyproject.toml enforces it), so all of it is testable alone.
"""
