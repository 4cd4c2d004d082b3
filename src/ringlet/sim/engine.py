"""The replay engine: a :class:`~ringlet.algorithms.schedule.Schedule` run in virtual time on a modelled network.

State. Every rank has two times: when the first segment of its data is ready (``first``) and when
all of it is (``last``); every link (:meth:`Topology.links`: ranks' ports, hosts' up- and downlinks)
has the time it is free again (``busy``). At the start all are 0.

One step, for all its transfers at once (numpy arrays, no Python object per transfer):

* a transfer of ``b`` bytes over link class ``c`` is cut into ``k = ceil(b/S)`` segments (``S`` the
  segment size; ``None``: one segment). ``m`` = the number of the step's transfers on the busier of
  its two links (``np.bincount``); ``r`` = the number of reducing receives of the step at its receiver.
  One segment takes ``τ = α_c + ε·e + (b/k)·(max(β_c·m, κ·e) + γ·r)`` (``γ`` only for reducing
  receives; ``e`` the step's message endpoints at the busier end as the network's ``cpus`` count them,
  ``ε`` and ``κ`` its ``epsilon`` and ``kappa``; with ``kappa_inter`` the endpoints of inter-host
  transfers are priced at it, as :meth:`~ringlet.tuning.network.Network.weighted_ends` does);
* it starts at ``t0 = max(first[src], busy[out link], busy[in link])``: when the sender has its first
  segment and both links have finished the earlier steps' transfers;
* its first segment is in at ``t0 + τ``, its last at ``max(last[src] + τ, t0 + k·τ)`` (segments
  follow the sender's own arrivals, one link time apart);
* a send the executor holds (:mod:`ringlet.algorithms.hold`) starts no earlier than its sender's
  ``last`` and the arrival of the sender's own sends of the step before;
* then the receiver's ``first``/``last`` become the max of their old values and the arrivals, and each
  link is ``busy`` until it has carried its own load of the step, ``t0 + k·α + m_link·b·β`` (the latest
  over its transfers): a transfer held back by its other link leaves this one partly idle. Where the
  processors bind (``b·κ·e`` more), it stays busy until they have handled the transfer's bytes, so a
  link's next step cannot overlap work its processors have not done.

The collective's time is the latest ``last``. With one segment this is ``α + b·β`` per transfer plus
``b·γ`` per reducing receive along the critical path; with ``k`` segments a chain of steps on distinct
links costs ``Σ τ_s + (k-1)·max τ_s`` (the pipelining formula the cost model uses), while steps that
reuse one link (a ring) are serialised by ``busy``. Limits are listed in docs/simulator.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..algorithms.hold import held_between
from ..algorithms.schedule import Schedule, StepArrays
from ..tuning.network import INTER, INTRA, Network, Topology


@dataclass(frozen=True, slots=True)
class Replay:
    """The outcome of one replay: ``seconds`` of virtual time until the last rank has all its data,
    ``steps`` replayed, ``transfers`` in total, ``largest`` transfer in bytes, ``segment_bytes`` used
    (``None``: whole transfers)."""

    seconds: float
    steps: int
    transfers: int
    largest: int
    segment_bytes: int | None


class _Costs(NamedTuple):
    """One step's transfers: ``per_segment`` time (shared bandwidth and reduction included), ``alpha``
    of their class, ``wire`` seconds at the class's full rate, ``cpu`` seconds their bytes take the
    processors that handle them (0 without ``kappa``), the two links, transfers per link."""

    per_segment: np.ndarray
    alpha: np.ndarray
    wire: np.ndarray
    cpu: np.ndarray
    out_link: np.ndarray
    in_link: np.ndarray
    load: np.ndarray


class _State:
    """Ready times of the ranks and free times of the links, advanced one step at a time."""

    def __init__(self, topology: Topology, network: Network, itemsize: int, segment_bytes: int | None):
        p = topology.size
        self.topology = topology
        self.first = np.zeros(p)
        self.last = np.zeros(p)
        self.busy = np.zeros(topology.nlinks)
        self.sent = np.zeros(p)  # when each rank's sends of the step before were all in
        self.alpha = np.array([network[INTRA].alpha, network[INTER].alpha])
        self.beta = np.array([network[INTRA].beta, network[INTER].beta])
        self.gamma = network.gamma
        self.epsilon, self.kappa, self.cpus = network.epsilon, network.kappa, network.cpus
        self.network = network
        self.itemsize = itemsize
        self.segment = segment_bytes

    def _segments(self, nbytes: np.ndarray) -> np.ndarray:
        if self.segment is None:
            return np.ones_like(nbytes)
        return np.maximum(1.0, np.ceil(nbytes / self.segment))

    def _costs(self, st: StepArrays, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, k: np.ndarray) -> _Costs:
        topo = self.topology
        inter, out_link, in_link = topo.links(src, dst)
        load = np.bincount(out_link, minlength=topo.nlinks) + np.bincount(in_link, minlength=topo.nlinks)
        cls = inter.astype(np.intp)
        alpha = self.alpha[cls]
        wire = nbytes * self.beta[cls]
        per_byte = self.beta[cls] * np.maximum(load[out_link], load[in_link])
        cpu = np.zeros_like(nbytes)
        if self.epsilon or self.kappa or self.network.kx:  # the step's endpoints at the busier end (as the cost model)
            ends = topo.endpoints(src, dst)
            alpha = alpha + self.epsilon * self.cpus.load(ends)
            inter_ends = ends if self.network.kappa_inter is None else topo.endpoints(src, dst, only=inter)
            weighted = self.network.weighted_ends(ends, inter_ends)  # one price: inter_ends is not read
            cpu_per_byte = self.cpus.load(weighted)
            cpu = nbytes * cpu_per_byte
            per_byte = np.maximum(per_byte, cpu_per_byte)
        per_segment = alpha + nbytes / k * per_byte
        if self.gamma and st.reduce.any():
            red = st.reduce.astype(bool)
            reducers = np.bincount(dst[red], minlength=topo.size)
            per_segment = per_segment + np.where(red, nbytes / k * self.gamma * reducers[dst], 0.0)
        return _Costs(per_segment, alpha, wire, cpu, out_link, in_link, load)

    def advance(self, st: StepArrays, held: np.ndarray) -> None:
        """Replay one step (all its transfers start from the state left by the earlier steps); the
        transfers ``held`` (indices) wait for all of their sender's data and sends of the step before."""
        if len(st) == 0:
            return
        src = st.src.astype(np.intp, copy=False)
        dst = st.dst.astype(np.intp, copy=False)
        nbytes = st.count.astype(np.float64) * self.itemsize
        k = self._segments(nbytes)
        c = self._costs(st, src, dst, nbytes, k)
        ready = self.first[src]
        if len(held):
            ready[held] = np.maximum(self.last[src[held]], self.sent[src[held]])
        start = np.maximum(ready, np.maximum(self.busy[c.out_link], self.busy[c.in_link]))
        got_first = start + c.per_segment
        got_last = np.maximum(self.last[src] + c.per_segment, start + k * c.per_segment)
        self.sent = np.zeros_like(self.sent)
        np.maximum.at(self.sent, src, got_last)
        # A link is free again once it has carried its own load, which may be before the transfer ends:
        # a transfer held back by its other link leaves this one partly idle for the next step's. Where
        # the processors bind, the link's next transfer waits for them too (they handle both).
        held = start + k * c.alpha
        np.maximum.at(self.busy, c.out_link, held + np.maximum(c.wire * c.load[c.out_link], c.cpu))
        np.maximum.at(self.busy, c.in_link, held + np.maximum(c.wire * c.load[c.in_link], c.cpu))
        np.maximum.at(self.first, dst, got_first)
        np.maximum.at(self.last, dst, got_last)


def replay(schedule: Schedule, topology: Topology, network: Network, *, itemsize: int = 4,
           segment_bytes: int | None = None) -> Replay:
    """Replay ``schedule`` on ``topology`` with the constants of ``network`` (model in the module doc),
    plus the network's per-call ``op`` when anything moves.

    ``itemsize`` is the bytes per element of the schedule's ranges; ``segment_bytes`` the pipelining
    segment (``None``: no segmentation). ``ValueError`` when the topology's rank count differs from the
    schedule's, or for ``itemsize < 1`` or ``segment_bytes < 1``.
    """
    if topology.size != schedule.nranks:
        raise ValueError(f"schedule {schedule.name!r} has {schedule.nranks} ranks, the topology {topology.size}")
    if itemsize < 1:
        raise ValueError(f"itemsize must be >= 1, got {itemsize}")
    if segment_bytes is not None and segment_bytes < 1:
        raise ValueError(f"segment_bytes must be >= 1 or None, got {segment_bytes}")
    state = _State(topology, network, itemsize, segment_bytes)
    transfers = largest = 0
    prev = None
    for s in range(schedule.num_steps):
        st = schedule.step_arrays(s)
        transfers += len(st)
        if len(st):
            largest = max(largest, int(st.count.max()) * itemsize)
        state.advance(st, np.zeros(0, np.int64) if prev is None else held_between(prev, st, schedule.nranks))
        prev = st
    seconds = float(state.last.max()) if schedule.nranks else 0.0
    if transfers:
        seconds += network.op  # the per-call software cost, once (as the cost model counts it)
    return Replay(seconds, schedule.num_steps, transfers, largest, segment_bytes)
