"""Compiled pieces of bmoe (Cython), built against llama-cpp-python's installed headers.

Only C-level mechanism lives here: eval callbacks that run inside llama.cpp's compute
threads, and (later) expert memory and O_DIRECT read lanes. Policy stays in ``bmoe.domain``.
"""
