"""``python -m bmoe.rpc_server``: serve this machine's devices to another bmoe (or llama.cpp)
over llama.cpp's RPC protocol, with ggml's own server (``ggml_backend_rpc_start_server``).

    python -m bmoe.rpc_server --host 127.0.0.1 --port 50052 [--device NAME] [-t N]

The other machine then runs ``python -m bmoe.cli -m model.gguf --rpc HOST:50052 -ngl N``
(docs/devices.md). As llama.cpp warns of its ``rpc-server``: the protocol has no
authentication and no encryption; never expose it on a network you do not trust. The default
host is 127.0.0.1 (this machine only).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bmoe.adapters.cpu_topology import physical_cores
from bmoe.adapters.llama import devices as ggml_devices
from bmoe.adapters.llama.log import ensure_backend
from bmoe.domain.placement import parse_device_names
from bmoe.errors import BmoeError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bmoe.rpc_server",
        description="Serve this machine's devices over llama.cpp's RPC protocol (never on an untrusted "
        "network: it has no authentication).",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)"
    )
    p.add_argument("-p", "--port", type=int, default=50052, help="port (default: 50052, llama.cpp's)")
    p.add_argument(
        "--device",
        default=None,
        metavar="NAME[,NAME...]",
        help="the devices to serve (default: the CPU; --list-devices)",
    )
    p.add_argument("--list-devices", action="store_true", help="print this machine's devices and exit")
    p.add_argument(
        "-t",
        "--threads",
        type=int,
        default=None,
        help=f"CPU threads of a served CPU device (default: one per physical core, here {physical_cores()})",
    )
    p.add_argument(
        "-c", "--cache", default=None, metavar="DIR", help="a local cache of tensors (llama.cpp's -c)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ensure_backend()
    try:
        if args.list_devices:
            for device in ggml_devices.devices():
                print(device.line())
            return 0
        if not ggml_devices.rpc_available():
            hint = ggml_devices.RPC_BUILD_HINT
            raise ggml_devices.RpcUnavailable(f"this llama.cpp has no RPC backend: reinstall with {hint}")
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"bmoe.rpc_server: warning: serving on {args.host}: anyone who reaches it can run "
                "computations here and read what it holds",
                file=sys.stderr,
            )
        names = parse_device_names(args.device)
        threads = args.threads or physical_cores()
        endpoint = f"{args.host}:{args.port}"
        sys.stdout.flush()
        ggml_devices.serve_rpc(endpoint, names, threads, args.cache)
    except BmoeError as exc:
        print(f"bmoe.rpc_server: error: {exc}", file=sys.stderr)
        return 2
    return 1  # the server returns only when it could not start


if __name__ == "__main__":
    sys.exit(main())
