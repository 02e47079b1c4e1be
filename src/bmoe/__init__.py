"""bmoe: run Mixture-of-Experts GGUF models larger than RAM on llama.cpp.

The public entry points so far: ``bmoe.runtime.run`` (one-shot generation),
``python -m bmoe.cli``, the errors in ``bmoe.errors`` and the tiny model fixtures in
``bmoe.testing.fixtures``. See docs/architecture.md for the layer map.
"""

from bmoe.errors import BmoeError

__version__ = "0.1.0"

__all__ = ["BmoeError", "__version__"]
