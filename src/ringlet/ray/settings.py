"""The executor's settings (``RayExecutor.create_settings``) and the import of ``ray`` itself."""
from __future__ import annotations

from dataclasses import dataclass


def import_ray():
    """The ``ray`` module; ``ImportError`` saying how to install it when it is missing."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("ringlet.ray needs the `ray` package: pip install 'ringlet[ray]' "
                          "(or pip install 'ray[train]>=2.9').") from exc
    return ray


@dataclass(frozen=True)
class RaySettings:
    """How long the executor waits, and where the workers' Gloo groups listen.

    ``timeout_s``: seconds :meth:`RayExecutor.start` waits for the workers to be placed and to answer;
    also the seconds :meth:`RayExecutor.run` gives the other workers to finish once one has failed
    (they stop with ringlet's ``PeerError`` within ``RINGLET_PEER_TIMEOUT``, usually far sooner).
    ``placement_group_timeout_s``: accepted for Horovod's signature; the executor waits ``timeout_s``.
    ``nics``: interface names the workers' Gloo groups listen on (``GLOO_SOCKET_IFNAME``); None: ringlet's
    choice (the interface towards the job's store). ``collective_timeout_s``: ringlet's collective
    timeout in the workers (``RINGLET_TIMEOUT``); None leaves ringlet's default.
    """

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0
    nics: frozenset[str] | None = None
    collective_timeout_s: float | None = None

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, not {self.timeout_s!r}.")
        if self.collective_timeout_s is not None and not self.collective_timeout_s > 0:
            raise ValueError(f"collective_timeout_s must be > 0 seconds, not {self.collective_timeout_s!r}.")
        if self.nics is not None:
            names = frozenset(self.nics)
            if not names or not all(isinstance(n, str) and n.strip() for n in names):
                raise ValueError(f"nics must be a non-empty set of interface names, not {self.nics!r}.")
            object.__setattr__(self, "nics", names)

    @classmethod
    def create(cls, timeout_s: float = 30.0, ssh_identity_file: str | None = None, ssh_str: str | None = None,
               placement_group_timeout_s: float = 100.0, nics=None, collective_timeout_s: float | None = None
               ) -> "RaySettings":
        """Horovod's ``RayExecutor.create_settings``. The ssh arguments have no use here (workers are Ray
        actors, never reached over ssh): passing one raises ``ValueError`` rather than being ignored."""
        if ssh_identity_file is not None or ssh_str is not None:
            raise ValueError("ringlet's RayExecutor starts no ssh sessions (workers are Ray actors): leave "
                             "ssh_identity_file and ssh_str unset.")
        return cls(timeout_s=float(timeout_s), placement_group_timeout_s=float(placement_group_timeout_s),
                   nics=None if nics is None else frozenset(nics), collective_timeout_s=collective_timeout_s)

    def worker_env(self) -> dict[str, str]:
        """The variables these settings add to every worker's environment."""
        env = {}
        if self.nics:
            env["GLOO_SOCKET_IFNAME"] = ",".join(sorted(self.nics))
        if self.collective_timeout_s is not None:
            env["RINGLET_TIMEOUT"] = str(self.collective_timeout_s)
        return env
