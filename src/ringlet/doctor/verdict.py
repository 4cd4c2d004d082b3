"""The doctor's table and verdict: pure functions of the measured table.

The table (as the JSON file holds it)::

    {"hosts": [{"name", "ranks", "gflops_1t", "gflops_nt", "threads", "mem_available", "mem_limit",
                "iface", "mtu", "clock_offset_s", "clock_err_s"}, ...],        # index 0: rank 0's host
     "pairs": [{"a", "b", "latency_us", "bw_ab_gbit", "bw_ba_gbit", "bw_gbit"}, ...]}  # a < b: host indices

Outliers (``RATIO`` = 0.7): a host whose compute (``gflops_nt``) is below RATIO x the median of the others;
a pair whose bandwidth is below RATIO x the median of the other pairs; a host with at least two pairs, all
of them slow, is named as one slow link (its pairs are not listed again); a clock whose offset from rank
0's host exceeds the threshold by more than its uncertainty; an MTU that differs from the most common one.
"""
from __future__ import annotations

import statistics
from collections import Counter

RATIO = 0.7
CLOCK_THRESHOLD_S = 0.01


def _slow_pairs(pairs: list[dict]) -> set[int]:
    slow = set()
    for i, p in enumerate(pairs):
        others = [q["bw_gbit"] for j, q in enumerate(pairs) if j != i]
        if others and p["bw_gbit"] < RATIO * statistics.median(others):
            slow.add(i)
    return slow


def _link_outliers(hosts: list[dict], pairs: list[dict]) -> list[str]:
    slow = _slow_pairs(pairs)
    out, explained = [], set()
    for h, host in enumerate(hosts):
        mine = [i for i, p in enumerate(pairs) if h in (p["a"], p["b"])]
        if len(mine) >= 2 and all(i in slow for i in mine):
            rest = [p["bw_gbit"] for i, p in enumerate(pairs) if i not in mine]
            bws = [pairs[i]["bw_gbit"] for i in mine]
            out.append(f"host {host['name']}'s link is slow (network-bound): its pairs {min(bws):.3g}-"
                       f"{max(bws):.3g} Gbit/s, the other pairs' median {statistics.median(rest):.3g} Gbit/s"
                       if rest else f"host {host['name']}'s link is slow (network-bound)")
            explained.update(mine)
    for i in sorted(slow - explained):
        p = pairs[i]
        others = statistics.median(q["bw_gbit"] for j, q in enumerate(pairs) if j != i)
        out.append(f"link {hosts[p['a']]['name']}-{hosts[p['b']]['name']} is slow: {p['bw_gbit']:.3g} Gbit/s, "
                   f"the other pairs' median {others:.3g} Gbit/s")
    return out


def _compute_outliers(hosts: list[dict]) -> list[str]:
    out = []
    for h, host in enumerate(hosts):
        others = [x["gflops_nt"] for j, x in enumerate(hosts) if j != h]
        if others and host["gflops_nt"] < RATIO * statistics.median(others):
            med = statistics.median(others)
            out.append(f"host {host['name']} is a compute straggler: {host['gflops_nt']:.3g} GFLOP/s, "
                       f"{host['gflops_nt'] / med:.2f}x the others' median {med:.3g}")
    return out


def _clock_outliers(hosts: list[dict], threshold: float) -> list[str]:
    return [f"host {h['name']}'s clock is off by {h['clock_offset_s'] * 1e3:+.1f} ms "
            f"(+-{h['clock_err_s'] * 1e3:.1f} ms) from {hosts[0]['name']}'s"
            for h in hosts[1:] if abs(h["clock_offset_s"]) - h["clock_err_s"] > threshold]


def _mtu_outliers(hosts: list[dict]) -> list[str]:
    known = [h["mtu"] for h in hosts if h["mtu"] is not None]
    if len(set(known)) <= 1:
        return []
    common = Counter(known).most_common(1)[0][0]
    return [f"MTU mismatch: host {h['name']} ({h['iface']}) has {h['mtu']}, the others {common}"
            for h in hosts if h["mtu"] is not None and h["mtu"] != common]


def verdict(table: dict, clock_threshold_s: float = CLOCK_THRESHOLD_S) -> list[str]:
    """The outliers of ``table``, one sentence each; or one ``no outlier: ...`` sentence. Raises
    ``ValueError`` for a table without hosts."""
    hosts, pairs = table["hosts"], table["pairs"]
    if not hosts:
        raise ValueError("doctor table has no hosts")
    found = (_compute_outliers(hosts) + _link_outliers(hosts, pairs) + _clock_outliers(hosts, clock_threshold_s)
             + _mtu_outliers(hosts))
    if found:
        return found
    gf = [h["gflops_nt"] for h in hosts]
    bw = f", bandwidth {min(p['bw_gbit'] for p in pairs):.3g}-{max(p['bw_gbit'] for p in pairs):.3g} Gbit/s" \
        if pairs else ""
    return [f"no outlier: {len(hosts)} hosts{bw}, compute {min(gf):.3g}-{max(gf):.3g} GFLOP/s"]


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2 ** 30:.1f}"


def format_table(table: dict) -> str:
    """The hosts' rows, then one row per pair, as fixed-width text."""
    lines = [f"{'host':<20} {'ranks':<8} {'GFLOP/s 1t':>10} {'GFLOP/s nt':>10} {'thr':>4} {'avail GiB':>9} "
             f"{'limit GiB':>9} {'iface':>10} {'mtu':>6} {'clock ms':>9} {'+-ms':>6}"]
    for h in table["hosts"]:
        lines.append(f"{h['name']:<20} {','.join(map(str, h['ranks'])):<8} {h['gflops_1t']:>10.2f} "
                     f"{h['gflops_nt']:>10.2f} {h['threads']:>4} {_gib(h['mem_available']):>9} "
                     f"{_gib(h['mem_limit']):>9} {h['iface']:>10} {str(h['mtu']):>6} "
                     f"{h['clock_offset_s'] * 1e3:>+9.2f} {h['clock_err_s'] * 1e3:>6.2f}")
    if table["pairs"]:
        lines.append("")
        lines.append(f"{'pair':<30} {'latency us':>10} {'a->b Gbit/s':>12} {'b->a Gbit/s':>12} {'Gbit/s':>8}")
    names = [h["name"] for h in table["hosts"]]
    for p in table["pairs"]:
        lines.append(f"{names[p['a']] + ' - ' + names[p['b']]:<30} {p['latency_us']:>10.1f} "
                     f"{p['bw_ab_gbit']:>12.3f} {p['bw_ba_gbit']:>12.3f} {p['bw_gbit']:>8.3f}")
    return "\n".join(lines)
