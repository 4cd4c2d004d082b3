"""All-to-all's schedules (pairwise, hierarchical, Bruck) against the reference: interpreted step by step
with their local copies, and run through the public API on in-process worlds of 1..8 ranks with
ragged splits (zero blocks, empty tensors), several dtypes and fake multi-host layouts; how ``"auto"``
chooses (size rule, cost model) and what the cost model and the simulator say of them."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from conftest import make_input, run_world, simulate

import ringlet
from ringlet import algorithms
from ringlet.algorithms import alltoall as a2a
from ringlet.algorithms import reference
from ringlet.runtime import Runtime
from ringlet.tuning import select
from ringlet.tuning.alltoall_select import alltoall_rule, predicted_times
from ringlet.tuning.network import Network, Topology
from ringlet.types import Options, dtype_name

ALGOS = sorted(algorithms.ALLTOALL)
WORLDS = range(1, 9)


def layouts(p: int) -> list[tuple[int, ...]]:
    """One host; pairs; two hosts interleaved; one rank per host; a lonely rank on host 0."""
    return sorted({(0,) * p, tuple(r // 2 for r in range(p)), tuple(r % 2 for r in range(p)), tuple(range(p)),
                   tuple(min(r, 1) for r in range(p))})


def count_matrices(p: int) -> list[tuple[tuple[int, ...], ...]]:
    """Ragged with zero blocks, all empty, even, and one rank sending everything to one peer."""
    rng = random.Random(p)
    ragged = tuple(tuple(rng.choice((0, 0, 1, 2, 3, 5)) for _ in range(p)) for _ in range(p))
    skewed = tuple(tuple(7 if (r, d) == (0, p - 1) else 0 for d in range(p)) for r in range(p))
    return [ragged, ((0,) * p,) * p, ((2,) * p,) * p, skewed]


def interpret(sched, counts, inputs):
    """The schedule's meaning: its local copies and steps applied literally (``conftest.simulate``),
    after the caller's copy of each rank's own block; returns every rank's output."""
    p = len(inputs)
    send_off, recv_off = a2a.offsets(a2a.matrix(p, counts))
    bufs = []
    for r in range(p):
        out = torch.full((sum(counts[s][r] for s in range(p)),), -1, dtype=torch.int64)
        c = counts[r][r]
        out[recv_off[r, r]:recv_off[r, r] + c] = inputs[r][send_off[r, r]:send_off[r, r] + c]
        bufs.append((out, inputs[r].clone(), torch.full((a2a.scratch_elems(sched, r),), -9, dtype=torch.int64)))
    copies = sched.meta.get("copies")
    if copies is None:
        return [b[0] for b in simulate(sched, bufs)]
    for k, one in enumerate(a2a.rounds(sched)):
        for r in range(p):
            a2a.local_copy(copies[k][r], bufs[r])
        bufs = simulate(one, bufs)
    for r in range(p):
        a2a.local_copy(copies[-1][r], bufs[r])
    return [b[0] for b in bufs]


def check_well_formed(sched, p: int, counts) -> None:
    sizes = [(sum(counts[s][r] for s in range(p)), sum(counts[r]), a2a.scratch_elems(sched, r)) for r in range(p)]
    for s, t in sched.transfers():
        assert t.src != t.dst and t.count > 0, (s, t)
        assert 0 <= t.offset and t.offset + t.count <= sizes[t.src][t.src_buf], (s, t)
        assert 0 <= t.recv_offset and t.recv_offset + t.count <= sizes[t.dst][t.dst_buf], (s, t)
        assert not t.reduce


@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("algo", ALGOS)
def test_schedules_step_by_step_equal_the_reference(algo, p):
    for counts in count_matrices(p):
        inputs = [torch.arange(sum(counts[r]), dtype=torch.int64) + 1000 * r for r in range(p)]
        expected = reference.alltoall(inputs, counts)
        for host_of in layouts(p):
            sched = algorithms.ALLTOALL[algo](p, counts, host_of)
            check_well_formed(sched, p, counts)
            got = interpret(sched, counts, inputs)
            for d in range(p):
                assert torch.equal(got[d], expected[d]), (algo, p, host_of, counts, d)


def test_schedule_shapes():
    """Steps and messages per rank: what each schedule is for."""
    p = 8
    even = ((4,) * p,) * p
    two_hosts = tuple(r // 4 for r in range(p))
    assert algorithms.ALLTOALL["pairwise"](p, even, two_hosts).num_steps == p - 1
    bruck = algorithms.ALLTOALL["bruck"](p, even, two_hosts)
    assert bruck.num_steps == 3 and bruck.num_transfers == 3 * p  # one message per rank per round
    assert bruck.bytes_sent(1) == [3 * 4 * 4] * p  # every round carries half of the blocks
    hier = algorithms.ALLTOALL["hierarchical"](p, even, two_hosts)
    assert hier.num_steps == 2
    inter = [t for _, t in hier.transfers() if two_hosts[t.src] != two_hosts[t.dst]]
    assert len(inter) == p  # one message per destination, from its handler on the other host
    assert all(t.count == 4 * 4 for t in inter)  # the four sources' blocks together
    # Degenerate layouts: one step, every block straight to its destination.
    assert algorithms.ALLTOALL["hierarchical"](p, even, (0,) * p).num_steps == 1
    assert algorithms.ALLTOALL["hierarchical"](p, even, tuple(range(p))).num_steps == 1


def test_builders_reject_bad_matrices():
    with pytest.raises(ValueError, match="rows"):
        algorithms.ALLTOALL["bruck"](3, ((1, 1),) * 3, (0, 0, 0))
    with pytest.raises(ValueError, match="non-negative"):
        algorithms.ALLTOALL["pairwise"](2, ((1, -1), (0, 0)), (0, 0))
    with pytest.raises(ValueError, match="host_of"):
        algorithms.ALLTOALL["hierarchical"](2, ((1, 1), (1, 1)), (0,))


# ---- through the public API on in-process worlds ---------------------------------------------------
def _cases(p: int):
    """Per case, every rank's (tensor, splits): ragged with zero blocks and 3 columns, an empty
    tensor, and one rank sending everything to its right neighbour."""
    rng = random.Random(100 + p)
    ragged = [[rng.choice((0, 1, 2, 4)) for _ in range(p)] for _ in range(p)]
    neighbour = [[5 if d == (r + 1) % p and r == 0 else 0 for d in range(p)] for r in range(p)]
    out = []
    for splits, cols in ((ragged, 3), ([[0] * p for _ in range(p)], 2), (neighbour, 1)):
        out.append([(make_input(r, sum(splits[r]) * cols, torch.float32, seed=cols).reshape(-1, cols), splits[r])
                    for r in range(p)])
    return out


def _check_cases(cases, res, label):
    p = len(cases[0])
    for i, case in enumerate(cases):
        tensors, splits = [t for t, _ in case], [s for _, s in case]
        expected = reference.alltoall(tensors, splits)
        for d in range(p):
            out, recv = res[d][i]
            assert out.dtype == expected[d].dtype and out.shape == expected[d].shape, (label, i, d)
            assert torch.equal(out, expected[d]), (label, i, d)
            assert list(recv) == [splits[s][d] for s in range(p)], (label, i, d)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("p", WORLDS)
@pytest.mark.parametrize("algo", ALGOS + ["auto"])
def test_public_alltoall(algo, p, lazy):
    """Every schedule through ``ringlet.alltoall`` (tiny segments: every message is many; with lazy
    sends, a range overwritten while a send of it is unread shows)."""
    cases = _cases(p)
    res = run_world(p, lambda rank: [ringlet.alltoall(c[rank][0], c[rank][1], algorithm=algo) for c in cases],
                    options=Options(timeout=20, segment_bytes=8), lazy=lazy)
    _check_cases(cases, res, f"{algo} p={p}")


DTYPES = (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int64)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_dtypes(dtype):
    p = 5
    splits = [[(r * 3 + d) % 4 for d in range(p)] for r in range(p)]
    inputs = [make_input(r, sum(splits[r]) * 2, torch.int64).reshape(-1, 2).to(dtype) for r in range(p)]
    expected = reference.alltoall(inputs, splits)
    res = run_world(p, lambda rank: [ringlet.alltoall(inputs[rank], splits[rank], algorithm=a)[0] for a in ALGOS])
    for d in range(p):
        for i, algo in enumerate(ALGOS):
            assert res[d][i].dtype == dtype and torch.equal(res[d][i], expected[d]), (algo, d)


HOST_LAYOUTS = [(0, 0, 1, 1), (0, 1, 0, 1), (0, 0, 0, 1, 1), (0, 1, 1, 1, 2), (0, 0, 1, 1, 2, 2, 3, 3),
                (1, 1, 0, 0, 0, 2)]


@pytest.mark.parametrize("host_of", HOST_LAYOUTS, ids=lambda h: "".join(map(str, h)))
def test_fake_hosts(monkeypatch, host_of):
    """Several hosts in one process: every rank's runtime sees the hostnames of ``host_of``, so groups
    carry that layout (sub-groups too) and the two-level schedule runs across those hosts."""
    monkeypatch.setattr(Runtime, "_exchange_hostnames", lambda self: tuple(f"h{h}" for h in host_of))
    p = len(host_of)
    cases = _cases(p)
    names = ALGOS + ["auto"]

    def fn(rank):
        rt = ringlet.collectives.runtime()
        assert rt.world.host_of == tuple(sorted(set(host_of), key=host_of.index).index(h) for h in host_of)
        sub = rt.new_group(range(1, p))
        outs = [[ringlet.alltoall(c[rank][0], c[rank][1], algorithm=a) for c in cases] for a in names]
        big = make_input(rank, 64 * (p - 1), torch.float32).reshape(-1, 8)
        sub_out = ringlet.alltoall(big, group=sub, algorithm="hierarchical")[0] if rank else None
        return outs, sub_out

    res = run_world(p, fn)
    for i, algo in enumerate(names):
        _check_cases(cases, [r[0][i] for r in res], f"{algo} hosts={host_of}")
    bigs = [make_input(r, 64 * (p - 1), torch.float32).reshape(-1, 8) for r in range(1, p)]
    expected = reference.alltoall(bigs, [[8] * (p - 1)] * (p - 1))
    for r in range(1, p):
        assert torch.equal(res[r][1], expected[r - 1]), r


def test_bad_algorithm_is_a_clear_error():
    def fn(rank):
        with pytest.raises(ValueError, match="unknown all-to-all algorithm 'ring'"):
            ringlet.alltoall(torch.zeros(2), algorithm="ring")
        with pytest.raises(ValueError, match="must be a name"):
            ringlet.alltoall_async(torch.zeros(2), algorithm=3)
        return ringlet.alltoall(torch.arange(2.0) + rank, algorithm=" Bruck ")[0]

    outs = run_world(2, fn)
    assert outs[0].tolist() == [0.0, 1.0] and outs[1].tolist() == [1.0, 2.0]


def test_forced_algorithms_that_differ_are_a_mismatch():
    from ringlet.types import MismatchError

    def fn(rank):
        with pytest.raises(MismatchError, match="algorithm"):
            ringlet.alltoall(torch.zeros(2), algorithm="bruck" if rank else "pairwise")

    run_world(2, fn, options=Options(timeout=20, check=True))


# ---- choosing ----------------------------------------------------------------------------------------
def test_size_rule():
    one, two = (0,) * 8, (0, 0, 0, 0, 1, 1, 1, 1)
    # Without a cost model pairwise, whatever the size and layout (what the emulated cluster measured).
    assert {alltoall_rule(8, b, hosts) for b in (100, 1 << 20) for hosts in (one, two)} == {"pairwise"}
    small = ((16,) * 8,) * 8
    assert select.Selector().alltoall("auto", small, 4, one) == "pairwise"
    assert select.Selector().alltoall("hierarchical", small, 4, one) == "hierarchical"
    assert select.alltoall(None) == "auto"


def _network(link="10gbit", latency="30us", epsilon=10e-6) -> Network:
    return dataclasses.replace(Network.of(link=link, latency=latency), epsilon=epsilon)


@pytest.mark.parametrize("host_of", [(0,) * 8, (0, 0, 0, 0, 1, 1, 1, 1), tuple(r // 4 for r in range(16))],
                         ids=["1x8", "2x4", "4x4"])
def test_cost_model_ranks_bruck_first_for_tiny_and_not_for_large(host_of):
    """On a network of 10 Gbit/s, 30 us per message and 10 us per message endpoint: Bruck's log2(p)
    rounds win for 64-byte blocks; for 1 MiB blocks, moving every byte log2(p)/2 times loses to the
    schedules that move it once."""
    p, net = len(host_of), _network()
    tiny = predicted_times(p, 16, 4, host_of, net)
    assert min(tiny, key=tiny.get) == "bruck", tiny
    large = predicted_times(p, 1 << 18, 4, host_of, net)
    assert min(large, key=large.get) in ("pairwise", "hierarchical"), large
    assert large["bruck"] > 1.3 * min(large.values())
    model = select.Model(net)
    assert select.Selector(model).alltoall("auto", ((16,) * p,) * p, 4, host_of) == "bruck"
    assert select.Selector(model).alltoall("auto", ((1 << 18,) * p,) * p, 4, host_of) in ("pairwise",
                                                                                          "hierarchical")


def test_model_choice_respects_fanout_limit():
    """Without a per-message price the timing model flatters a rank sending to many peers in one step:
    the two-level schedule's gather is left out (as direct all-reduce is)."""
    host_of = (0, 0, 0, 0, 1, 1, 1, 1)
    model = select.Model(_network(epsilon=0.0))
    assert model.fanout_limit == 2
    assert select.alltoall_choice("auto", ((1 << 16,) * 8,) * 8, 4, host_of, model) != "hierarchical"


def test_simulator_and_cost_model_accept_every_schedule():
    from ringlet.sim.api import predicted, simulate as replay

    topo, net = Topology((0, 0, 0, 0, 1, 1, 1, 1)), _network()
    for algo in ALGOS:
        for nbytes in (8 * 8 * 4, 8 << 20):
            sim = replay("alltoall", algo, nbytes, topo, net)
            model = predicted("alltoall", algo, nbytes, topo, net)
            assert sim.seconds > 0 and model.seconds == pytest.approx(sim.seconds, rel=0.05), (algo, nbytes)


# ---- receive counts given (recv_splits) -------------------------------------------------------------
class _FakeNative:
    """A native all-reduce (SUM, MAX) for the in-process transport, as Gloo's: every member of ``ranks``
    calls it in the same order; the n-th calls of a group are reduced together (sizes must match)."""

    def __init__(self):
        import threading

        self.cond, self.slots, self.seq = threading.Condition(), {}, {}

    def __call__(self, tr, buf, op, ranks):
        from ringlet.types import ReduceOp

        key = (tuple(ranks), tr.rank)
        with self.cond:
            n = self.seq[key] = self.seq.get(key, -1) + 1
            slot = self.slots.setdefault((tuple(ranks), n), {})
            slot[tr.rank] = buf.clone()
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: len(slot) == len(ranks), timeout=20):
                raise TimeoutError("fake native all-reduce: a member did not come")
            vals = torch.stack([slot[r] for r in ranks])  # raises on different sizes, as a failed collective
        buf.copy_(vals.sum(0) if ReduceOp.parse(op) == ReduceOp.SUM else vals.max(0).values)
        return True


@pytest.fixture(params=["records", "p2p", "native"])
def count_path(request, monkeypatch):
    """Where an all-to-all's counts and check travel: the record exchange (schedules), MPI's small path
    (records in band) or a native all-reduce (Gloo's digest round and the count matrix's all-reduce)."""
    from conftest import P2P_SMALL
    from ringlet.transport.inproc import InprocTransport

    if request.param == "p2p":
        monkeypatch.setattr(InprocTransport, "capabilities", P2P_SMALL)
    elif request.param == "native":
        fake = _FakeNative()
        monkeypatch.setattr(InprocTransport, "capabilities",
                            dataclasses.replace(InprocTransport.capabilities, native_digest=True))
        monkeypatch.setattr(InprocTransport, "native_allreduce",
                            lambda self, buf, op, ranks: fake(self, buf, op, ranks))
    return request.param


@pytest.mark.parametrize("p", WORLDS)
def test_public_alltoall_with_recv_splits(count_path, p):
    """Every schedule and ``auto``, checked and not, with the receive counts given: the reference's
    answer (``auto`` and ``pairwise`` exchange no counts; the others exchange them)."""
    cases = _cases(p)
    names = ALGOS + ["auto"]

    def fn(rank):
        out = []
        for algo in names:
            for check in (True, False):
                for c in cases:
                    recv = [c[s][1][rank] for s in range(p)]
                    out.append(ringlet.alltoall(c[rank][0], c[rank][1], algorithm=algo, recv_splits=recv,
                                                check=check))
        return out

    res = run_world(p, fn, options=Options(timeout=20, segment_bytes=8))
    n = len(cases)
    for i in range(len(names) * 2):
        _check_cases(cases, [r[i * n:(i + 1) * n] for r in res], f"{names[i // 2]} check={i % 2 == 0} p={p}")


@pytest.mark.parametrize("p", [2, 3, 5])
def test_mismatched_recv_splits_raise_on_every_rank(count_path, p):
    """A rank expecting one row more from rank 0 than rank 0 sends: the same MismatchError, naming the
    pair, on every rank, with every schedule (checked; the schedules that exchange the counts check them
    also unchecked); and receive counts given on some ranks only. The next call then works."""
    from ringlet.types import MismatchError

    splits = [[(r + d) % 3 for d in range(p)] for r in range(p)]
    wrong = f"rank 0 sends {splits[0][p - 1]} rows to rank {p - 1}, but rank {p - 1} expects {splits[0][p - 1] + 1}"
    cases = [(a, True) for a in ALGOS + ["auto"]] + [("hierarchical", False), ("bruck", False)]

    def fn(rank):
        x = torch.arange(float(sum(splits[rank])))
        recv = [splits[s][rank] for s in range(p)]
        bad = [c + (1 if rank == p - 1 and s == 0 else 0) for s, c in enumerate(recv)]
        for algo, check in cases:
            with pytest.raises(MismatchError, match=wrong):
                ringlet.alltoall(x, splits[rank], algorithm=algo, recv_splits=bad, check=check)
        with pytest.raises(MismatchError, match="receive counts"):
            ringlet.alltoall(x, splits[rank], recv_splits=recv if rank else None, check=True)
        return ringlet.alltoall(x, splits[rank], recv_splits=recv)

    res = run_world(p, fn, options=Options(timeout=20))
    inputs = [torch.arange(float(sum(splits[r]))) for r in range(p)]
    expected = reference.alltoall(inputs, splits)
    for d in range(p):
        assert torch.equal(res[d][0], expected[d]) and res[d][1] == [splits[s][d] for s in range(p)]


def test_recv_splits_bad_arguments():
    def fn(rank):
        x = torch.zeros(4)
        own = [1, 2] if rank == 0 else [2, 1]
        for recv, msg in (([2], "has 1 entries"), ([2, -1], "non-negative"), (own, "own block"),
                          ([2.5, 2], "integers"), (torch.zeros(2), "integer tensor")):
            with pytest.raises(ValueError, match=msg):
                ringlet.alltoall(x, [2, 2], recv_splits=recv)
        return ringlet.alltoall(x + rank, [2, 2], recv_splits=torch.tensor([2, 2]))[0]

    outs = run_world(2, fn)
    assert outs[0].tolist() == [0, 0, 1, 1] and outs[1].tolist() == [0, 0, 1, 1]


def test_count_residuals_cancel_only_when_consistent():
    """The residuals of consistent counts sum to zero modulo both primes; one count off does not."""
    from ringlet.engine.a2a_counts import MODULI, residuals

    rng = random.Random(7)
    for p in (2, 3, 8, 33):
        m = [[rng.randrange(0, 1 << 40) for _ in range(p)] for _ in range(p)]
        cols = [[m[s][d] for s in range(p)] for d in range(p)]
        assert all(sum(residuals(p, r, m[r], cols[r])[j] for r in range(p)) % q == 0 for j, q in enumerate(MODULI))
        cols[1][0] += 1
        assert any(sum(residuals(p, r, m[r], cols[r])[j] for r in range(p)) % q for j, q in enumerate(MODULI))


def test_an_other_op_meets_an_alltoall_with_recv_splits(count_path):
    """A rank calling an all-reduce while the other calls an all-to-all with receive counts: both meet in
    the check's round and raise the same MismatchError; the next call works."""
    from ringlet.types import MismatchError

    def fn(rank):
        with pytest.raises(MismatchError, match="Mismatched operations"):
            if rank:
                ringlet.alltoall(torch.zeros(2), recv_splits=[1, 1])
            else:
                ringlet.allreduce(torch.zeros(2))
        return ringlet.alltoall(torch.arange(2.0) + 2 * rank, recv_splits=[1, 1])[0].tolist()

    assert run_world(2, fn, options=Options(timeout=20)) == [[0.0, 2.0], [1.0, 3.0]]
