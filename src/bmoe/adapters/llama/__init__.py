"""Owner classes over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

Each class owns one C resource and frees it deterministically (``close()`` or ``with``),
in the spirit of llama-cpp-python's ``_internals.py`` and not of its ``Llama`` class.
"""

from bmoe.adapters.llama.context import ContextParams, LlamaContext
from bmoe.adapters.llama.model import LlamaModel, ModelParams
from bmoe.adapters.llama.sampler import Sampler

__all__ = ["ContextParams", "LlamaContext", "LlamaModel", "ModelParams", "Sampler"]
