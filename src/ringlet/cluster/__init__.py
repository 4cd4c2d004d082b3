"""Emulate several equal hosts on one machine: ``ringlet cluster up/down/exec/status`` and ``ringlet run --cluster``.

Each emulated host is a network namespace on a private subnet (``10.213.0.0/24`` by default) joined
to the others by a bridge; its link is capped with ``tc tbf`` in both directions, and its processes
share a CPU quota in their own cgroup (:mod:`.cgroup`). ``ringlet run --cluster`` starts one node
launcher per host through :mod:`._rsh` (cgroup, hostname, ``ip netns exec``), with the rendezvous on
the first host's address: ranks of one host talk over its loopback, ranks of different hosts only
over the capped links. Needs root. See docs/cluster.md.
"""
from __future__ import annotations

from .launch import run_job, run_options
from .manager import down, leftovers, status, up
from .state import ClusterError, ClusterSpec, ClusterState, load, parse_rate, require

__all__ = ["ClusterError", "ClusterSpec", "ClusterState", "down", "leftovers", "load", "parse_rate", "require",
           "run_job", "run_options", "status", "up"]
