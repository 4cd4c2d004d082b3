"""Properties of schedules, checked without running them: shape (ranges, self-sends, step counts),
volume (bytes per rank against the cost formulas) and meaning (the step-by-step interpretation
equals the reference for many world sizes and host layouts)."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import simulate

from ringlet import algorithms
from ringlet.algorithms import (binomial, halving_doubling, hierarchical, recursive_doubling, reference, ring, torus,
                                tree)
from ringlet.algorithms import alltoall, barrier, direct
from ringlet.types import ReduceOp

ALGOS = sorted(algorithms.ALLREDUCE)
WORLDS = range(1, 17)
COUNTS = (0, 1, 2, 3, 7, 16, 33, 100)


def layouts(p: int) -> list[tuple[int, ...]]:
    """One host; one rank per host; pairs; two hosts interleaved; one lonely rank on host 1."""
    return sorted({tuple([0] * p), tuple(range(p)), tuple(r // 2 for r in range(p)),
                   tuple(r % 2 for r in range(p)), tuple(min(r, 1) for r in range(p)),
                   tuple(int(r == p - 1) for r in range(p))})


def check_well_formed(sched, p: int, nbufs_elems: tuple[int, ...]) -> None:
    assert sched.nranks == p
    assert sched.num_steps < 65536 - 64, "steps must fit below the tag space reserved for metadata"
    for s, step in enumerate(sched.steps):
        assert step, f"step {s} is empty"
        for t in step:
            assert 0 <= t.src < p and 0 <= t.dst < p, t
            assert t.src != t.dst, f"self-send at step {s}: {t}"
            assert t.count > 0, t
            assert 0 <= t.offset and t.offset + t.count <= nbufs_elems[t.src_buf], t
            assert 0 <= t.recv_offset and t.recv_offset + t.count <= nbufs_elems[t.dst_buf], t


@pytest.mark.parametrize("algo", ALGOS)
def test_allreduce_schedules_well_formed_and_correct(algo):
    build = algorithms.ALLREDUCE[algo]
    for p in WORLDS:
        for host_of in layouts(p):
            for count in COUNTS:
                sched = build(p, count, host_of)
                check_well_formed(sched, p, (count,))
                inputs = [torch.arange(count, dtype=torch.int64) * (r + 3) + r * r for r in range(p)]
                got = simulate(sched, [(t,) for t in inputs], ReduceOp.SUM)
                expected = reference.allreduce(inputs, ReduceOp.SUM)
                for r in range(p):
                    assert torch.equal(got[r][0], expected[r]), (algo, p, host_of, count, r)


@pytest.mark.parametrize("algo", ALGOS)
def test_builders_are_cached_and_trivial_cases_empty(algo):
    build = algorithms.ALLREDUCE[algo]
    assert build(6, 1000, (0, 0, 0, 1, 1, 1)) is build(6, 1000, (0, 0, 0, 1, 1, 1))
    assert build(1, 1000, (0,)).num_steps == 0
    assert build(5, 0, (0,) * 5).num_steps == 0


# ---- volume and step counts -----------------------------------------------------------------------
@pytest.mark.parametrize("p", range(2, 13))
def test_ring_bytes_and_steps(p):
    n = 64 * p  # divisible: the formula is exact
    sched = ring.allreduce(p, n)
    assert sched.num_steps == 2 * (p - 1)
    assert sched.bytes_sent(4) == [4 * 2 * (p - 1) * n // p] * p


@pytest.mark.parametrize("p", range(2, 17))
def test_halving_doubling_bytes_and_steps(p):
    pp = 1 << (p.bit_length() - 1)
    extra = p - pp
    n = 48 * pp
    sched = halving_doubling.allreduce(p, n)
    assert sched.num_steps == 2 * math.ceil(math.log2(p))
    assert sched.num_steps == 2 * (pp.bit_length() - 1) + (2 if extra else 0)
    core = 2 * (pp - 1) * n // pp
    expected = []
    for r in range(p):
        if r < 2 * extra and r % 2 == 0:
            expected.append(n)  # folded in: sends its vector once, gets the result back
        elif r < 2 * extra:
            expected.append(core + n)  # takes part for two, returns the result
        else:
            expected.append(core)
    assert sched.bytes_sent(1) == expected


@pytest.mark.parametrize("p", range(2, 17))
def test_recursive_doubling_rounds_and_bytes(p):
    """ceil(log2 p) rounds of whole-vector swaps (two more for folded-in ranks); half halving-doubling's rounds."""
    pp = 1 << (p.bit_length() - 1)
    extra = p - pp
    n = 10
    sched = recursive_doubling.allreduce(p, n)
    assert sched.num_steps == (pp.bit_length() - 1) + (2 if extra else 0)
    assert sched.num_steps <= halving_doubling.allreduce(p, 48 * p).num_steps // 2 + (1 if extra else 0)
    rounds = pp.bit_length() - 1
    for r, sent in enumerate(sched.bytes_sent(1)):
        if r < 2 * extra and r % 2 == 0:
            assert sent == n
        else:
            assert sent == n * (rounds + (1 if r < 2 * extra else 0))


def test_halving_doubling_keeps_big_exchanges_near():
    """Distances grow as messages shrink: on 2 hosts x 4 ranks only n/8-sized pieces cross hosts."""
    n = 1 << 12
    host_of = (0, 0, 0, 0, 1, 1, 1, 1)
    assert inter_host_bytes(halving_doubling.allreduce(8, n), host_of) == [n, n]
    sched = halving_doubling.allreduce(8, n)
    first = sched.steps[0]
    assert all(abs(t.src - t.dst) == 1 and t.count == n // 2 for t in first)


def test_halving_doubling_small_counts_drop_empty_blocks():
    sched = halving_doubling.allreduce(8, 3)
    assert all(t.count > 0 for _, t in sched.transfers())
    assert sum(sched.bytes_sent(1)) < sum(halving_doubling.allreduce(8, 8).bytes_sent(1))


@pytest.mark.parametrize("p", range(1, 20))
def test_double_binary_tree_shape(p):
    parents = tree.trees(p)
    interiors = []
    for parent in parents:
        assert parent.count(-1) == 1, "exactly one root"
        root = parent.index(-1)
        for r in range(p):  # every rank reaches the root: a tree, no cycles
            seen, x = set(), r
            while x != root:
                assert x not in seen
                seen.add(x)
                x = parent[x]
        kids = [parent.count(r) for r in range(p)]
        assert max(kids) <= 2, "binary"
        interiors.append({r for r in range(p) if kids[r]})
    assert not interiors[0] & interiors[1], "a rank is interior in both trees"


@pytest.mark.parametrize("p", range(2, 20))
def test_double_binary_tree_bytes_and_steps(p):
    n = 2 * 50
    half = n // 2
    sched = tree.allreduce(p, n)
    assert sched.num_steps == 2 * (p.bit_length() - 1)
    expected = [0] * p
    for parent in tree.trees(p):
        for r in range(p):
            if parent[r] >= 0:
                expected[r] += half  # up to the parent
            expected[r] += parent.count(r) * half  # down to the children
    assert sched.bytes_sent(1) == expected
    assert max(expected) <= 2 * n


def _grid_shape(p, host_of):
    rows = torus.grid(p, host_of)
    return len(rows), len(rows[0])


@pytest.mark.parametrize("p,host_of,shape", [
    (4, (0, 0, 0, 0), (2, 2)), (6, (0,) * 6, (2, 3)), (8, (0,) * 8, (2, 4)), (9, (0,) * 9, (3, 3)),
    (7, (0,) * 7, (1, 7)), (5, (0,) * 5, (1, 5)), (6, (0, 0, 0, 1, 1, 1), (2, 3)), (6, (0, 1) * 3, (2, 3)),
    (8, (0, 0, 1, 1, 2, 2, 3, 3), (4, 2)), (4, (0, 0, 0, 1), (2, 2)), (4, (0, 1, 2, 3), (2, 2)),
])
def test_torus_grid_choice(p, host_of, shape):
    assert _grid_shape(p, host_of) == shape
    rows = torus.grid(p, host_of)
    assert sorted(r for row in rows for r in row) == list(range(p))


def test_torus_rows_follow_hosts():
    assert torus.grid(6, (0, 1, 0, 1, 0, 1)) == [(0, 2, 4), (1, 3, 5)]


@pytest.mark.parametrize("p", range(2, 17))
def test_torus_steps(p):
    r, c = _grid_shape(p, (0,) * p)
    sched = torus.allreduce(p, 60 * p, (0,) * p)
    assert sched.num_steps == 2 * (c - 1) + 2 * (r - 1)
    flat = ring.allreduce(p, 60 * p)
    assert sum(sched.bytes_sent(1)) == sum(flat.bytes_sent(1))  # same volume as the ring...
    if r > 1:
        assert sched.num_steps < flat.num_steps  # ...in fewer steps
    else:  # prime p: one row, the ring itself
        assert sorted(sched.bytes_sent(1)) == sorted(flat.bytes_sent(1))


def inter_host_bytes(sched, host_of) -> list[int]:
    """Elements each host sends to other hosts."""
    out = [0] * (max(host_of) + 1)
    for _, t in sched.transfers():
        if host_of[t.src] != host_of[t.dst]:
            out[host_of[t.src]] += t.count
    return out


def test_hierarchical_uplink_two_by_two():
    n = 1 << 12
    host_of = (0, 0, 1, 1)
    assert inter_host_bytes(hierarchical.allreduce(4, n, host_of), host_of) == [n, n]
    assert inter_host_bytes(ring.allreduce(4, n), host_of) == [3 * n // 2, 3 * n // 2]


@pytest.mark.parametrize("hosts,local", [(2, 2), (2, 4), (3, 2), (4, 2), (2, 3)])
def test_hierarchical_uplink_and_steps(hosts, local):
    p, n = hosts * local, 240 * hosts * local
    host_of = tuple(r // local for r in range(p))
    sched = hierarchical.allreduce(p, n, host_of)
    assert inter_host_bytes(sched, host_of) == [2 * (hosts - 1) * n // hosts] * hosts
    assert sched.num_steps == 2 * (local - 1) + 2 * (hosts - 1)
    # Interleaved placement gives the same volumes: rows follow host_of, not rank order.
    inter = tuple(r % hosts for r in range(p))
    assert inter_host_bytes(hierarchical.allreduce(p, n, inter), inter) == [2 * (hosts - 1) * n // hosts] * hosts


@pytest.mark.parametrize("p", range(1, 9))
def test_hierarchical_degenerates_to_ring(p):
    n = 24 * p
    ring_bytes = sorted(ring.allreduce(p, n).bytes_sent(1))
    for host_of in ((0,) * p, tuple(range(p))):
        sched = hierarchical.allreduce(p, n, host_of)
        assert sched.num_steps == ring.allreduce(p, n).num_steps
        assert sorted(sched.bytes_sent(1)) == ring_bytes


def test_hierarchical_uneven_hosts_use_min_shards():
    host_of = (0, 0, 0, 1)
    sched = hierarchical.allreduce(4, 90, host_of)
    assert sched.meta["shards"] == 1
    assert inter_host_bytes(sched, host_of) == [90, 90]


def test_host_of_length_is_checked():
    with pytest.raises(ValueError):
        hierarchical.allreduce(4, 10, (0, 0, 1))
    with pytest.raises(ValueError):
        torus.allreduce(4, 10, (0, 0, 1))


# ---- the other collectives' schedules --------------------------------------------------------------
@pytest.mark.parametrize("p", range(1, 10))
def test_other_schedules_well_formed(p):
    for root in range(p):
        check_well_formed(binomial.broadcast(p, 5, root), p, (5,))
        check_well_formed(binomial.reduce(p, 5, root), p, (5,))
    counts = tuple((r * 3) % 4 for r in range(p))
    check_well_formed(ring.allgather(p, counts), p, (sum(counts),))
    check_well_formed(ring.reduce_scatter(p, counts), p, (sum(counts),))
    check_well_formed(direct.allgather(p, counts), p, (sum(counts),))
    check_well_formed(barrier.dissemination(p), p, (1,))
    assert barrier.dissemination(p).num_steps == (p - 1).bit_length()
    send = tuple(tuple((r + d) % 3 for d in range(p)) for r in range(p))
    sched = alltoall.pairwise(p, send)
    for _, t in sched.transfers():
        assert t.src_buf == 1 and t.dst_buf == 0
        assert t.offset + t.count <= sum(send[t.src])
        assert t.recv_offset + t.count <= sum(send[s][t.dst] for s in range(p))
