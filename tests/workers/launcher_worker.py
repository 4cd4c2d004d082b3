"""Rank of the launcher-defaults job (``test_launcher_defaults.py``): what a rank of ``ringlet run`` finds.

``python launcher_worker.py OUT``: every rank initialises ringlet the way the launcher says, all-reduces
through ringlet and through torch.distributed's default group, and rank 0 also looks at the job's store:
the addresses its port listens on (``/proc/net/tcp*``) and whether a connection to a non-loopback
address of this machine at that port is refused. Each rank writes ``OUT.rank<r>`` (JSON).
"""
from __future__ import annotations

import json
import os
import socket
import sys


def _addr(hexaddr: str) -> str:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw[::-1])}:{int(port, 16)}"
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # four little-endian 32-bit words
    return f"[{socket.inet_ntop(socket.AF_INET6, words)}]:{int(port, 16)}"


def listening_addresses(port: int) -> list[str]:
    """Every local address listening on TCP ``port`` on this machine (this network namespace)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:  # 0A: LISTEN
                out.append(_addr(fields[1]))
    return out


def outside_address() -> str | None:
    """A non-loopback IPv4 address of this machine (the one its default route would use), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # UDP connect: picks a source address, sends nothing
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def reachable(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=5):
            return True
    except OSError:
        return False


def main(out: str) -> None:
    import torch
    import torch.distributed as dist

    import ringlet

    ringlet.init()
    rank = ringlet.rank()
    t = torch.full((4,), float(rank + 1))
    ringlet.allreduce_(t)
    u = torch.full((4,), float(rank + 1))
    dist.all_reduce(u)  # torch.distributed's default group, as a script using DDP or its hooks would
    rec = {"rank": rank, "env_transport": os.environ.get("RINGLET_TRANSPORT"),
           "transport": ringlet.collectives.runtime().transport.name, "ringlet_sum": t.tolist(),
           "dist_sum": u.tolist(), "master_addr": os.environ["MASTER_ADDR"], "port": int(os.environ["MASTER_PORT"])}
    if rank == 0:
        port = rec["port"]
        rec["listening"] = listening_addresses(port)
        other = outside_address()
        rec["outside"] = other
        rec["outside_reachable"] = reachable(other, port) if other else None
        rec["loopback_reachable"] = reachable("127.0.0.1", port)
    ringlet.shutdown()
    rec["dist_after_shutdown"] = dist.is_initialized()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(rec, f)


if __name__ == "__main__":
    main(sys.argv[1])
