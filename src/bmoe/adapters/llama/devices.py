"""ggml's devices through llama.cpp's own API: list them, add RPC servers as devices, pick them
by name for a model's ``devices``, and serve this machine's devices over RPC.

Every function is resolved from the ggml library llama-cpp-python loaded (``llama_cpp._ggml``);
the RPC ones through the RPC backend's registry (``ggml_backend_reg_get_proc_address``), as
llama.cpp's tools do. A build of llama-cpp-python without ``-DGGML_RPC=ON`` has no RPC backend:
``RpcUnavailable`` says which CMake flag is missing.
"""

from __future__ import annotations

import ctypes
import socket
from collections.abc import Sequence

import attrs

from bmoe.adapters.llama.ggml_symbols import address, typed
from bmoe.errors import ConfigError

DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator"}  # enum ggml_backend_dev_type
RPC_BUILD_HINT = (
    'CMAKE_ARGS="-DGGML_RPC=ON" pip install --no-cache-dir --force-reinstall llama-cpp-python==0.3.36'
)


class RpcUnavailable(ConfigError):
    """This build of llama.cpp has no RPC backend (built without ``-DGGML_RPC=ON``)."""


_VP, _CP, _SZ = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
_dev_count = typed("ggml_backend_dev_count", _SZ)
_dev_get = typed("ggml_backend_dev_get", _VP, _SZ)
_dev_name = typed("ggml_backend_dev_name", _CP, _VP)
_dev_description = typed("ggml_backend_dev_description", _CP, _VP)
_dev_type = typed("ggml_backend_dev_type", ctypes.c_int, _VP)
_dev_memory = typed("ggml_backend_dev_memory", None, _VP, ctypes.POINTER(_SZ), ctypes.POINTER(_SZ))
_dev_by_type = typed("ggml_backend_dev_by_type", _VP, ctypes.c_int)
_dev_buffer_type = typed("ggml_backend_dev_buffer_type", _VP, _VP)
_reg_by_name = typed("ggml_backend_reg_by_name", _VP, _CP)
_reg_proc = typed("ggml_backend_reg_get_proc_address", _VP, _VP, _CP)
_register = typed("ggml_backend_register", None, _VP)


@attrs.frozen
class Device:
    """One ggml device: ``handle`` is its ``ggml_backend_dev_t``."""

    name: str
    description: str
    kind: str
    free_bytes: int
    total_bytes: int
    handle: int = attrs.field(repr=False)

    def line(self) -> str:
        """As llama.cpp's ``--list-devices`` prints it."""
        mib = 1024 * 1024
        return (
            f"  {self.name}: {self.description} ({self.total_bytes // mib} MiB, "
            f"{self.free_bytes // mib} MiB free)"
        )


def devices() -> list[Device]:
    """Every device ggml knows now (the CPU, GPUs, RPC servers added so far)."""
    out = []
    for i in range(_dev_count()):
        handle = _dev_get(i)
        free, total = _SZ(0), _SZ(0)
        _dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        out.append(
            Device(
                name=(_dev_name(handle) or b"").decode(),
                description=(_dev_description(handle) or b"").decode(),
                kind=DEVICE_TYPES.get(_dev_type(handle), "unknown"),
                free_bytes=free.value,
                total_bytes=total.value,
                handle=int(handle),
            )
        )
    return out


def offload_devices(names: Sequence[str] = ()) -> list[Device]:
    """The devices ``names`` picks (every non-CPU device when empty), in the given order;
    ConfigError naming what exists for a name that is none of them, or when there is none."""
    known = devices()
    if names:
        by_name = {d.name: d for d in known}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ConfigError(
                f"--device: no device named {', '.join(missing)} (there are: "
                f"{', '.join(d.name for d in known)}; --list-devices describes them)"
            )
        return [by_name[n] for n in names]
    chosen = [d for d in known if d.kind != "CPU"]
    if not chosen:
        raise ConfigError(
            "-ngl: this llama.cpp has no GPU or RPC device (a CPU-only build: build llama-cpp-python "
            "with CUDA, Metal, Vulkan or RPC, or give --rpc HOST:PORT; docs/devices.md)"
        )
    return chosen


def _rpc_reg() -> int:
    reg = _reg_by_name(b"RPC")
    if not reg:
        raise RpcUnavailable(
            f"this llama.cpp was built without its RPC backend: reinstall with {RPC_BUILD_HINT}"
        )
    return int(reg)


def rpc_available() -> bool:
    """Whether this llama.cpp has its RPC backend."""
    return bool(_reg_by_name(b"RPC"))


def _reachable(endpoint: str, timeout_s: float = 3.0) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def add_rpc_servers(endpoints: Sequence[str]) -> None:
    """Register each RPC server's devices with ggml (llama.cpp's ``--rpc``); ConfigError for
    a server that does not answer."""
    proc = _reg_proc(_rpc_reg(), b"ggml_backend_rpc_add_server")
    if not proc:
        raise RpcUnavailable("this llama.cpp's RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(_VP, _CP)(proc)
    for endpoint in endpoints:
        if any(d.description == endpoint for d in devices()):
            continue  # added before in this process (ggml keeps one registry per server)
        if not _reachable(endpoint):
            raise ConfigError(
                f"--rpc: no RPC server answers at {endpoint} (start one: python -m bmoe.rpc_server)"
            )
        reg = add_server(endpoint.encode())
        if not reg:
            raise ConfigError(f"--rpc: the server at {endpoint} offers no device")
        _register(reg)


def cpu_buffer_type() -> int:
    """The CPU device's buffer type (``ggml_backend_cpu_buffer_type()``: what a buffer-type
    override to the host names)."""
    cpu = _dev_by_type(0)
    if not cpu:
        raise ConfigError("this llama.cpp has no CPU device")
    return int(_dev_buffer_type(cpu))


def serve_rpc(endpoint: str, device_names: Sequence[str], n_threads: int, cache_dir: str | None) -> None:
    """Serve the named devices (the CPU when empty) on ``endpoint`` with ggml's own RPC server;
    blocks for good (llama.cpp's ``rpc-server``)."""
    proc = _reg_proc(_rpc_reg(), b"ggml_backend_rpc_start_server")
    if not proc:
        raise RpcUnavailable("this llama.cpp's RPC backend has no ggml_backend_rpc_start_server")
    known = devices()
    if device_names:
        chosen = [d for d in known if d.name in device_names]
    else:
        chosen = [d for d in known if d.kind == "CPU"]
    if not chosen or (device_names and len(chosen) != len(device_names)):
        raise ConfigError(f"--device: not among {', '.join(d.name for d in known)}")
    handles = (_VP * len(chosen))(*[d.handle for d in chosen])
    start = ctypes.CFUNCTYPE(None, _CP, _CP, _SZ, _SZ, ctypes.POINTER(_VP))(proc)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, len(chosen), handles)


def backend_api() -> dict[str, int]:
    """The addresses of the ggml functions the streamer calls on a tensor that may live on a
    device (``ExpertStreamer.set_backend_api``)."""
    return {
        "tensor_get": address("ggml_backend_tensor_get"),
        "buffer_is_host": address("ggml_backend_buffer_is_host"),
        "nbytes": address("ggml_nbytes"),
    }
