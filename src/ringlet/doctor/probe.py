"""What one host measures alone: compute speed, free memory, the traffic interface's MTU.

The parsing helpers are pure (text in, values out) so they are tested without the host's files.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time

import torch

MATMUL_N = 512  # the fixed problem: an N x N float32 matrix multiply, 2 N^3 flops


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` text -> ``{field: bytes}`` (``kB`` values times 1024; unitless values as they are).
    Lines that do not parse raise ``ValueError`` naming the line."""
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts or not parts[0].isdigit() or len(parts) > 2:
            raise ValueError(f"meminfo line not understood: {line!r}")
        out[key.strip()] = int(parts[0]) * (1024 if len(parts) == 2 and parts[1] == "kB" else 1)
    return out


def parse_cgroup_limit(text: str) -> int | None:
    """The content of cgroup v2 ``memory.max`` (or v1 ``memory.limit_in_bytes``) -> bytes, or None for
    ``max`` or a v1 "unlimited" value (at least 2**62)."""
    value = text.strip()
    if value == "max":
        return None
    if not value.isdigit():
        raise ValueError(f"cgroup memory limit not understood: {value!r}")
    return None if int(value) >= 2 ** 62 else int(value)


def parse_ip_addr(text: str) -> dict[str, str]:
    """``ip -o -4 addr`` output -> ``{ipv4 address: interface}`` (``veth0@if5`` named ``veth0``)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if "inet" not in parts or len(parts) < 2:
            continue
        addr = parts[parts.index("inet") + 1].split("/")[0]
        out[addr] = parts[1].split("@")[0]
    return out


def read_mtu(iface: str, root: str = "/sys/class/net") -> int | None:
    """The MTU of ``iface`` from ``ROOT/IFACE/mtu``, or None when the file is absent."""
    try:
        with open(os.path.join(root, iface, "mtu")) as f:
            return int(f.read().strip())
    except FileNotFoundError:
        return None


def local_address_towards(addr: str) -> str:
    """The local IPv4 address the kernel would send from to reach ``addr`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return s.getsockname()[0]


def traffic_interface(addr: str) -> tuple[str, int | None]:
    """``(interface, mtu)`` of the interface that carries traffic to ``addr`` (``"?"`` when ``ip`` is
    missing or does not list the local address)."""
    local = local_address_towards(addr)
    if local.startswith("127."):
        return "lo", read_mtu("lo")
    try:
        text = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?", None
    iface = parse_ip_addr(text).get(local, "?")
    return iface, read_mtu(iface) if iface != "?" else None


def memory() -> dict[str, int | None]:
    """Free memory: ``MemAvailable`` of ``/proc/meminfo`` and this process's cgroup limit (None: none)."""
    with open("/proc/meminfo") as f:
        info = parse_meminfo(f.read())
    limit = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = parse_cgroup_limit(f.read())
            break
        except FileNotFoundError:
            continue
    return {"mem_available": info.get("MemAvailable", info.get("MemFree")), "mem_limit": limit}


def matmul_gflops(threads: int, min_seconds: float) -> float:
    """GFLOP/s of repeated float32 ``MATMUL_N`` matrix multiplies on ``threads`` threads, over at least
    ``min_seconds`` of wall time (longer than a CPU quota's period, so a throttled host shows it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.rand(MATMUL_N, MATMUL_N)
        b = torch.rand(MATMUL_N, MATMUL_N)
        torch.mm(a, b)  # warm-up
        count, t0 = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            count += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_seconds:
                return 2.0 * MATMUL_N ** 3 * count / elapsed / 1e9
    finally:
        torch.set_num_threads(before)
