"""CPU quotas for emulated hosts: one cgroup per host, in the cgroup v1 ``cpu`` controller or cgroup v2.

A host's quota is ``cpus × period`` of CPU time per period (100 ms), enforced by the kernel's CFS
bandwidth control: a host of 0.5 CPU runs at most 50 ms in every 100 ms however many processes it
has, so hosts are equal machines and one host's compute cannot borrow another's cores.

- v1 (the ``cpu`` controller mounted on its own hierarchy, e.g. ``/sys/fs/cgroup/cpu``):
  ``cpu.cfs_period_us`` and ``cpu.cfs_quota_us``.
- v2 (a ``cgroup2`` mount whose ``cgroup.controllers`` lists ``cpu``): ``cpu.max`` = ``"QUOTA PERIOD"``,
  after enabling ``+cpu`` in the parent's ``cgroup.subtree_control``.

Groups are made at the root of the hierarchy (``<root>/rgl-hN``): a v2 group below a non-root group
that holds processes could not get the cpu controller. A process joins by writing its pid to
``cgroup.procs``; its children inherit the group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel's lower bound for a CFS quota


class CgroupError(RuntimeError):
    pass


def _write(path: Path, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise CgroupError(f"cannot write {text.strip()!r} to {path}: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class CpuController:
    """The cpu controller of one cgroup hierarchy; ``root`` is where the per-host groups are made."""

    version: int
    root: str

    def path(self, name: str) -> Path:
        return Path(self.root) / name

    def create(self, name: str, cpus: float) -> str:
        """Make group ``name`` limited to ``cpus`` CPUs; returns its directory."""
        quota = int(round(cpus * PERIOD_US))
        if quota < MIN_QUOTA_US:
            raise CgroupError(f"a quota of {cpus} CPU is below the kernel's minimum ({MIN_QUOTA_US / PERIOD_US} CPU)")
        p = self.path(name)
        if self.version == 2:
            ctl = Path(self.root) / "cgroup.subtree_control"
            if "cpu" not in ctl.read_text().split():
                _write(ctl, "+cpu")
        p.mkdir(exist_ok=True)
        if self.version == 1:
            # Period first: the kernel checks the quota against the period in force.
            _write(p / "cpu.cfs_period_us", str(PERIOD_US))
            _write(p / "cpu.cfs_quota_us", str(quota))
        else:
            _write(p / "cpu.max", f"{quota} {PERIOD_US}")
        return str(p)

    def quota(self, name: str) -> float | None:
        """The quota of group ``name`` in CPUs, read back from the kernel (None: unlimited or absent)."""
        p = self.path(name)
        try:
            if self.version == 1:
                q = int((p / "cpu.cfs_quota_us").read_text())
                period = int((p / "cpu.cfs_period_us").read_text())
                return None if q < 0 else q / period
            q, period = (p / "cpu.max").read_text().split()
            return None if q == "max" else int(q) / int(period)
        except (OSError, ValueError):
            return None

    def join(self, name: str, pid: int = 0) -> None:
        """Move process ``pid`` (0: the caller) into group ``name``."""
        _write(self.path(name) / "cgroup.procs", str(pid or os.getpid()))

    def pids(self, name: str) -> list[int]:
        try:
            return [int(x) for x in (self.path(name) / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def remove(self, name: str) -> None:
        """Remove group ``name`` (its processes must have exited; a missing group is fine)."""
        try:
            os.rmdir(self.path(name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CgroupError(f"cannot remove cgroup {self.path(name)}: {exc.strerror or exc}") from exc

    def groups(self, prefix: str) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self.root) if e.is_dir() and e.name.startswith(prefix))
        except OSError:
            return []


def detect(mounts: str = "/proc/self/mounts") -> CpuController | None:
    """The cpu controller of this machine: a v1 hierarchy carrying ``cpu`` if mounted (it then owns the
    controller), else a cgroup2 mount that offers ``cpu``; None if neither exists."""
    v2 = None
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        where, fstype, opts = parts[1].replace("\\040", " "), parts[2], parts[3].split(",")
        if fstype == "cgroup" and "cpu" in opts:
            return CpuController(1, where)
        if fstype == "cgroup2" and v2 is None:
            try:
                if "cpu" in (Path(where) / "cgroup.controllers").read_text().split():
                    v2 = CpuController(2, where)
            except OSError:
                pass
    return v2
