"""One endpoint per host for the ranks of a job: what ``ringlet run --metrics-port P`` serves.

The launcher's agent on each host (:func:`ringlet.launch.agent.run_agent`) gives its ranks a folder
(``RINGLET_METRICS_DIR``); each rank serves its own metrics on 127.0.0.1 at a port the OS picks and
writes that port there (:mod:`.serve`). The agent serves ``/metrics`` on ``P``: at each scrape it reads
the folder, scrapes every rank's endpoint over loopback (in parallel, ``timeout`` seconds each), and
serves the union, every rank's samples under its own ``rank`` label. A rank that does not answer (not
started yet, or gone) is left out of that scrape and counted in ``ringlet_host_ranks{state="unreachable"}``.
Straggler scores set on several ranks for the same (rank, host) are served once: the lowest reporting
rank's value.
"""
from __future__ import annotations

import concurrent.futures
import glob
import os
import re
import urllib.request

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["HostEndpoint", "merge", "read_ports"]

_PORT_FILE = re.compile(r"rank-(\d+)\.port$")


def read_ports(folder: str) -> dict[int, int]:
    """rank -> port from the ``rank-<R>.port`` files in ``folder`` (unreadable or partial files skipped)."""
    out = {}
    for path in glob.glob(os.path.join(folder, "rank-*.port")):
        m = _PORT_FILE.search(path)
        try:
            with open(path) as fh:
                port = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if m and 0 < port < 65536:
            out[int(m.group(1))] = port
    return out


def merge(texts: list[str]) -> list:
    """The metric families of several Prometheus text expositions merged by name: the first text's help and
    type, every text's samples, a sample whose name and labels an earlier text had left out."""
    families: dict[str, object] = {}
    seen: set = set()
    for text in texts:
        for fam in text_string_to_metric_families(text):
            have = families.get(fam.name)
            if have is None:
                have = families[fam.name] = fam
                samples, fam.samples = fam.samples, []
            else:
                samples = fam.samples
            for s in samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key not in seen:
                    seen.add(key)
                    have.samples.append(s)
    return list(families.values())


class _HostCollector:
    def __init__(self, folder: str, timeout: float) -> None:
        self.folder, self.timeout = folder, timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="ringlet-metrics")

    def describe(self):
        return []

    def _fetch(self, port: int) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=self.timeout) as resp:
                return resp.read().decode("utf-8", errors="replace")
        except OSError:
            return None

    def collect(self):
        ports = read_ports(self.folder)
        ranks = sorted(ports)
        texts = list(self._pool.map(self._fetch, [ports[r] for r in ranks]))
        ok = [t for t in texts if t is not None]
        yield from merge(ok)
        g = GaugeMetricFamily("ringlet_host_ranks", "Ranks of this host's job found by the agent's last scrape.",
                              labels=["state"])
        g.add_metric(["scraped"], len(ok))
        g.add_metric(["unreachable"], len(texts) - len(ok))
        yield g


class HostEndpoint:
    """The agent's endpoint on ``addr``:``port`` over the ranks advertised in ``folder`` (created)."""

    def __init__(self, folder: str, port: int, addr: str = "0.0.0.0", timeout: float = 2.0) -> None:
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self._collector = _HostCollector(folder, timeout)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=registry)
        except OSError as exc:
            raise OSError(exc.errno, f"ringlet run --metrics-port: cannot serve on {addr}:{port}: "
                          f"{exc.strerror or exc}") from exc
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._collector._pool.shutdown(wait=False)
