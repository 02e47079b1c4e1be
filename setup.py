"""Build the Cython extension of bmoe against the headers of the installed llama-cpp-python.

Everything else about the package lives in pyproject.toml. The headers come from the
llama-cpp-python wheel (``site-packages/include``), never from a copy of llama.cpp:
the struct layouts we read (``struct ggml_tensor``) must be the ones the loaded library uses.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup


def llama_cpp_include_dir() -> str:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bmoe's build needs llama-cpp-python==0.3.36 installed (it ships the headers)")
    # the wheel installs its headers beside the package: site-packages/include
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    include = package_dir.parent / "include"
    if not (include / "ggml.h").is_file():
        raise SystemExit(f"llama-cpp-python's headers are missing: no ggml.h in {include}")
    return str(include)


INCLUDE = llama_cpp_include_dir()
# the engine's rooms, included into expert_stream.pyx (a change to one rebuilds it)
ENGINE_ROOMS = sorted(str(p) for p in Path("src/bmoe/cext/stream").glob("*.pxi"))

extensions = [
    Extension(
        f"bmoe.cext.{name}",
        [f"src/bmoe/cext/{name}.pyx"],
        include_dirs=[INCLUDE],
        extra_compile_args=["-O2"],
    )
    for name in (
        "route_recorder", "abort_flag", "cache_core", "route_policy", "probe", "weight_repack", "log_filter", "load_hook", "cpu_probe", "crash_signal"
    )
] + [
    Extension(
        "bmoe.cext.expert_stream",
        ["src/bmoe/cext/expert_stream.pyx"],
        depends=ENGINE_ROOMS,
        include_dirs=[INCLUDE],
        define_macros=[("_GNU_SOURCE", None)],
        # read lanes are POSIX threads that block between batches
        extra_compile_args=["-O2", "-pthread"],
        extra_link_args=["-pthread"],
    ),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3"},
        include_path=["src"],
    ),
)
