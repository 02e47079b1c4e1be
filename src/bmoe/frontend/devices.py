"""``--list-devices``: print the devices ggml knows and exit (both commands)."""

from __future__ import annotations

import argparse

from bmoe.adapters.llama import devices as ggml_devices
from bmoe.domain.placement import parse_rpc_servers


def list_devices(args: argparse.Namespace) -> int:
    """``--list-devices``: the devices ggml knows (the RPC servers of ``--rpc`` added)."""
    if args.rpc:
        ggml_devices.add_rpc_servers(parse_rpc_servers(args.rpc))
    print("Available devices:")
    for device in ggml_devices.devices():
        print(device.line())
    return 0
