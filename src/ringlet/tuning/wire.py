"""Telling links from the processors that copy their bytes: the end of step 7 of calibration (a
processor price per link class) and step 8 (the wire between hosts).

**Per link class** (:func:`split_kappa`). Step 7 fits one ``kappa`` to whole all-reduces that mix
intra- and inter-host transfers. The intra-host shift pattern bounds what an intra-host endpoint can
cost: ``P_intra = β_intra · sharing_intra / load_intra`` (no shift ran slower). Where the fitted
``kappa`` exceeds it by more than ``MARGIN``, the calls' processor time is not the intra-host
endpoints': ``kappa`` becomes ``P_intra`` and ``kappa_inter`` is fitted again to the same calls
(:func:`~ringlet.tuning.fit.fit_kappa`), kept when it is above ``P_intra``. Emulated hosts send
between hosts through bridges and shapers, a longer kernel path than within a host.

**The wire** (step 8).

The shift pattern of step 1 runs every rank's transfer at once, so its β is the rate one transfer gets
while all of them share the processors. Where the hosts are emulated on one machine (or the wire is
faster than the processors) that rate is set by the processors, and a step in which fewer ranks move
bytes runs faster than β says: the double binary tree's steps, for instance, where the leaves idle.

Step 8 times one inter-host transfer alone (rank 0 to its counterpart on the next host, every other
rank idle) against the inter-host shift pattern at the same size, alternated. :func:`split_wire`
reads the two:

* the lone transfer per byte ``λ = β_inter · sharing_inter · (t_lone − a) / (t_shift − a)`` with
  ``a`` the fitted per-step α and the per-operation overhead (the ratio, not the absolute time, so a
  slow phase of a shared machine falls on both);
* ``P = min_c β_c · sharing_c / load_c`` over the measured classes: the most the processors can cost
  per byte and unit of endpoint load (``load_c``: the shift pattern's endpoint load as
  :meth:`~ringlet.tuning.network.Cpus.load` counts it), since no shift pattern ran slower per byte;
* when the lone transfer ran faster (``λ < (1 − margin)·β_inter``) and the processors can explain the
  inter shift (``P·load_inter ≥ (1 − margin)·β_inter·sharing_inter``), the inter link's β becomes
  ``λ`` and ``kappa`` becomes at least ``P``: the shift pattern is then predicted as it measured
  (bound by the processors), the lone transfer too, and steps with fewer endpoints get the
  processors' share instead of the shift pattern's rate. Otherwise (the lone transfer ran at the
  shift's rate: the wire binds; or the shift ran slower than the processors explain: the links bind)
  nothing changes. An ``intra`` row that was not measured copies the new ``inter`` row.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from .fit import fit_kappa
from .network import INTER, INTRA, LINK_CLASSES, LinkCost, Network, Topology
from .patterns import Pattern, chain, sharing, shift_pattern

MARGIN = 0.1  # relative difference below which the lone transfer and the shift count as the same rate
_REPS = 7  # timings of each pattern, alternated; the medians are compared


def split_kappa(network: Network, host_of: Sequence[int], measured: Sequence[float],
                predict: Callable[[Network], Sequence[float]], margin: float = MARGIN) -> tuple[Network, dict]:
    """``network`` (its ``kappa`` fitted to the step-7 calls ``measured``) with a processor price per
    link class where the intra shift pattern bounds ``kappa`` below the fit (module doc), and what was
    decided. ``predict(net)``: the calls' predicted seconds under ``net``. Unchanged without both link
    classes in the layout."""
    topology = Topology(tuple(host_of))
    intra, inter = shift_pattern(host_of, INTRA), shift_pattern(host_of, INTER)
    if not intra or not inter or network.kappa <= 0:
        return network, {}
    bound = network[INTRA].beta * sharing(intra, topology) / pattern_load(intra, topology, network)
    seen = {"intra_bound": bound, "single": network.kappa, "split": False}
    if network.kappa <= (1 + margin) * bound:
        return network, seen
    base = dataclasses.replace(network, kappa=bound, kappa_inter=None)
    scale = max(network[c].beta for c in LINK_CLASSES) or 1e-9
    kx = fit_kappa(measured, lambda k: predict(dataclasses.replace(base, kappa_inter=k)), scale)
    seen["kappa_inter"] = kx
    if kx <= bound:
        return network, seen
    seen["split"] = True
    return dataclasses.replace(base, kappa_inter=kx), seen


def lone_pattern(host_of: Sequence[int]) -> Pattern:
    """One inter-host transfer: rank 0 to the first rank of the next host (empty on one host)."""
    hosts = list(dict.fromkeys(host_of))
    if len(hosts) < 2:
        return ()
    nxt = list(host_of).index(hosts[(hosts.index(host_of[0]) + 1) % len(hosts)])
    return ((0, nxt),)


def pattern_load(pattern: Pattern, topology: Topology, network: Network) -> float:
    """The largest endpoint load of ``pattern``'s transfers under ``network.cpus`` (1 when empty)."""
    if not pattern:
        return 1.0
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*pattern))
    return float(network.cpus.load(topology.endpoints(src, dst).astype(np.float64)).max())


@dataclasses.dataclass(frozen=True)
class WireEvidence:
    """What :func:`split_wire` reads. ``shift_s``/``lone_s``: measured seconds of one step of the inter
    shift pattern and of the lone transfer at ``nbytes``; ``fixed_s``: their part that is not per byte
    (α and per-operation overhead); ``sharing``/``load``: per measured class, the shift pattern's
    link sharing and endpoint load."""

    nbytes: int
    shift_s: float
    lone_s: float
    fixed_s: float
    sharing: dict
    load: dict


def split_wire(network: Network, ev: WireEvidence, margin: float = MARGIN) -> tuple[Network, dict]:
    """``network`` with the inter link's β and ``kappa`` read from ``ev`` (module doc), and what was
    decided. ``ValueError`` for a non-positive size or time, or a margin outside [0, 1)."""
    if ev.nbytes <= 0 or ev.shift_s <= 0 or ev.lone_s <= 0 or not 0 <= margin < 1:
        raise ValueError(f"split_wire needs positive sizes and times and 0 <= margin < 1, got {ev} {margin}")
    beta = network[INTER].beta
    shift_bytes = max(ev.shift_s - ev.fixed_s, 1e-12)
    lone_beta = beta * ev.sharing[INTER] * max(ev.lone_s - ev.fixed_s, 0.0) / shift_bytes
    procs = min(network[c].beta * ev.sharing[c] / ev.load[c] for c in ev.sharing)
    faster = lone_beta < (1 - margin) * beta
    explained = procs * ev.load[INTER] >= (1 - margin) * beta * ev.sharing[INTER]
    seen = {"lone_beta": lone_beta, "shift_beta": beta, "processors": procs, "lone_faster": faster,
            "processors_explain_shift": explained, "split": faster and explained}
    if not (faster and explained):
        return network, seen
    links = dict(network.links)
    links[INTER] = LinkCost(network[INTER].alpha, lone_beta)
    if INTRA not in ev.sharing:
        links[INTRA] = links[INTER]
    kx = None if network.kappa_inter is None else max(network.kappa_inter, procs)
    return dataclasses.replace(network, links=links, kappa=max(network.kappa, procs), kappa_inter=kx), seen


def measure_wire(prober, nbytes: int, network: Network, host_of: tuple[int, ...],
                 overhead: float) -> tuple[Network, dict]:
    """Step 8 of the protocol (module doc) at ``nbytes`` per transfer: ``network`` as
    :func:`split_wire` leaves it, and the agreed timings and decision. Unchanged without two hosts
    or with fewer than 4 bytes."""
    p, topology = len(host_of), Topology(host_of)
    lone = lone_pattern(host_of)
    if not lone or nbytes < 4:
        return network, {}
    count = nbytes // 4
    buf = prober.buffer(3 * count)
    shift = shift_pattern(host_of, INTER)
    scheds = [chain(shift, p, count, 1), chain(lone, p, count, 1)]
    for s in scheds:
        prober.time_chain(s, buf, 1)  # warm-up
    mine = [prober.time_chain(s, buf, 1) for _ in range(_REPS) for s in scheds]
    slowest = prober.gather(mine).max(axis=0).reshape(_REPS, 2)
    shift_s, lone_s = (float(np.median(slowest[:, j])) for j in range(2))
    shares, loads = {}, {}
    for c in LINK_CLASSES:
        pattern = shift_pattern(host_of, c)
        if pattern:
            shares[c], loads[c] = sharing(pattern, topology), pattern_load(pattern, topology, network)
    ev = WireEvidence(count * 4, shift_s, lone_s, network[INTER].alpha + overhead, shares, loads)
    network, seen = split_wire(network, ev)
    seen.update({"bytes": ev.nbytes, "shift_s": shift_s, "lone_s": lone_s, "fixed_s": ev.fixed_s})
    return network, seen
