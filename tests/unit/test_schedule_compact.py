"""Compact schedules: the array builders emit exactly what the tuple-of-``Transfer`` builders did (frozen
digests, :mod:`schedule_cases`), the executor compiles exactly the same plans, a 1,024-rank schedule costs
megabytes, and the builder API, the lazy views and the byte-bounded caches keep their contracts."""
from __future__ import annotations

import json

import numpy as np
import pytest
import schedule_cases

from ringlet import algorithms
from ringlet.algorithms import direct, executor, ring
from ringlet.algorithms.cache import SizeBoundedCache, memoise
from ringlet.algorithms.schedule import Schedule, ScheduleBuilder, Transfer, even_split

FROZEN = json.loads(schedule_cases.DIGESTS.read_text())


# ---- the same schedules and plans as before -------------------------------------------------------
@pytest.fixture(scope="module")
def digests():
    return schedule_cases.digests()


@pytest.mark.parametrize("family", sorted(k for k in FROZEN if not k.startswith("plan ")))
def test_builders_emit_the_frozen_schedules(family, digests):
    assert digests[family] == FROZEN[family], f"{family}: the transfers differ from the frozen output"


# Every frozen world size up to 9, a power of two and one beyond 16 peers (the vectorised overlap
# queries); 12 and 24 add nothing those do not, and cost more than all the small ones together.
PLAN_CHECKED = tuple(p for p in schedule_cases.PLAN_WORLDS if p not in (12, 24))


@pytest.mark.parametrize("algo", sorted(algorithms.ALLREDUCE))
def test_executor_compiles_the_frozen_plans(algo):
    for p in PLAN_CHECKED:
        key = f"plan {algo} p={p}"
        assert schedule_cases.plan_digest(algo, p) == FROZEN[key], key


# ---- memory at 1,024 ranks ------------------------------------------------------------------------
P = 1024
HOST_OF = tuple(r // 8 for r in range(P))  # 128 hosts x 8 ranks
# Bound per all-reduce at 1,024 ranks, in MB of stored arrays. Ring: 2 B per transfer (an int16 range
# index; src and dst shared by all steps); direct: 2·1024·1023 transfers, src/dst/index stored once per
# shift pattern (int16); the others have O(p log p) or O(p·√p) transfers.
BOUND_MB = {"ring": 4.5, "direct": 8.5, "hierarchical": 1, "torus": 1, "tree": 0.1,
            "halving_doubling": 0.5, "recursive_doubling": 0.1}


def stored_bytes(sched: Schedule) -> int:
    """Bytes of the distinct buffers under every stored array (a view counts its base once)."""
    owners = {}
    store = sched.store
    arrays = [a for st in store.steps for a in st.arrays() if a is not None] + [store.offsets, store.counts]
    for a in arrays:
        while isinstance(a.base, np.ndarray):
            a = a.base
        owners[id(a)] = a.nbytes
    return sum(owners.values())


@pytest.mark.parametrize("count", [1 << 28, (1 << 28) + 3, 256, 1])
@pytest.mark.parametrize("algo", sorted(BOUND_MB))
def test_memory_at_1024_ranks(algo, count):
    sched = algorithms.ALLREDUCE[algo](P, count, HOST_OF)
    assert sched.nbytes() == stored_bytes(sched)
    assert sched.nbytes() <= BOUND_MB[algo] * 1e6, f"{algo}: {sched.nbytes() / 1e6:.2f} MB"
    sent = sched.bytes_sent(4)
    assert len(sent) == P and sum(sent) > 0
    if algo in ("ring", "direct"):
        assert sum(sent) == 4 * 2 * (P - 1) * count


def test_ring_at_1024_ranks_shares_arrays_and_uses_small_dtypes():
    sched = ring.allreduce(P, 1 << 28)
    assert sched.num_steps == 2 * (P - 1) and sched.num_transfers == 2 * (P - 1) * P
    first, last = sched.step_arrays(0), sched.step_arrays(sched.num_steps - 1)
    assert first.src is last.src and first.dst is last.dst
    assert first.src.dtype == np.int16 and first.offset.dtype == np.int32
    assert not first.src.flags.writeable
    with pytest.raises(ValueError):
        first.src[0] = 1
    assert sched.bytes_sent(4) == [4 * 2 * (P - 1) * (1 << 28) // P] * P


@pytest.mark.parametrize("rank", [0, 511, P - 1])
def test_compile_one_rank_of_1024_reads_only_its_transfers(rank):
    sched = direct.allreduce(P, 1 << 20)
    plan = executor.compile_plan.__wrapped__(sched, rank, 1 << 10)
    sends = [m for m in plan.msgs if m.is_send]
    assert len(sends) == 2 * (P - 1) and {m.peer for m in sends} == set(range(P)) - {rank}
    assert all(type(m.peer) is int and type(m.offset) is int for m in plan.msgs)


# ---- the builder API --------------------------------------------------------------------------------
def _rows(sched: Schedule) -> list[list[tuple]]:
    return [[(t.src, t.dst, t.offset, t.count, t.recv_offset, t.reduce, t.src_buf, t.dst_buf) for t in step]
            for step in sched.steps]


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("count", [0, 1, 7, 1 << 40])
def test_add_many_equals_add_one_by_one(p, count):
    rng = np.random.default_rng(p * 31 + count % 97)
    n = 4 * p
    src, dst = rng.integers(0, p, n), rng.integers(0, p, n)
    off, cnt = rng.integers(0, 1 << 30, n), rng.integers(0, 3, n) * count
    red, dof = rng.random(n) < 0.5, np.where(rng.random(n) < 0.5, -1, rng.integers(0, 99, n))
    slow, fast = ScheduleBuilder("x", p), ScheduleBuilder("x", p)
    for b in (slow, fast):
        b.new_step()
    for i in range(n):
        slow.add(int(src[i]), int(dst[i]), int(off[i]), int(cnt[i]), reduce=bool(red[i]), dst_offset=int(dof[i]))
    fast.add_many(src, dst, off, cnt, reduce=red, dst_offset=dof)
    assert _rows(slow.build()) == _rows(fast.build())


def test_add_many_drops_empty_and_self_transfers_and_empty_steps():
    b = ScheduleBuilder("x", 4)
    b.new_step()
    b.add_many([0, 1, 2, 3], [1, 1, 3, 0], 5, [2, 2, 0, 1], reduce=True)
    b.new_step()
    b.add_many([0, 1], [0, 1], 0, 3)  # all self-sends: the step vanishes
    b.new_step()
    b.add_many(2, [0, 1], [10, 20], 4, src_buf=1)  # scalars broadcast
    sched = b.build()
    assert _rows(sched) == [[(0, 1, 5, 2, 5, True, 0, 0), (3, 0, 5, 1, 5, True, 0, 0)],
                            [(2, 0, 10, 4, 10, False, 1, 0), (2, 1, 20, 4, 20, False, 1, 0)]]


def test_pieces_of_one_step_keep_their_order():
    b = ScheduleBuilder("x", 3)
    table = b.ranges([0, 4], [4, 4])
    b.new_step()
    b.add(0, 1, 8, 1)
    b.add_ranges([1, 2], [2, 0], table, [1, 0], reduce=True)
    b.add_many([2], [1], [9], [2], dst_offset=[0])
    assert _rows(b.build()) == [[(0, 1, 8, 1, 8, False, 0, 0), (1, 2, 4, 4, 4, True, 0, 0),
                                 (2, 0, 0, 4, 0, True, 0, 0), (2, 1, 9, 2, 0, False, 0, 0)]]


@pytest.mark.parametrize("call,error", [
    (lambda b: b.add_many([0, 1], [1, 0, 1], 0, 1), ValueError),  # lengths differ
    (lambda b: b.add_many([[0]], [1], 0, 1), ValueError),  # not 1-D
    (lambda b: b.add_many([0.5], [1], 0, 1), TypeError),  # not integers
    (lambda b: b.add_many(0, 1, 2.0, 1), TypeError),
    (lambda b: b.add_many(0, 1, 0, 1, reduce=[1]), TypeError),  # reduce not bool
    (lambda b: b.add_ranges(0, 1, b.ranges([0], [1]), 1), IndexError),  # outside the table
    (lambda b: b.add_ranges(0, 1, b.ranges([0], [1]), -1), IndexError),
    (lambda b: b.ranges([0, 1], [1]), ValueError),
    (lambda b: b.ranges([-1], [1]), ValueError),
    (lambda b: (b.add_many(0, 3, 0, 1), b.build()), ValueError),  # rank 3 of 3
    (lambda b: (b.add_many(-1, 0, 0, 1), b.build()), ValueError),
])
def test_bad_builder_input_raises(call, error):
    with pytest.raises(error):
        call(ScheduleBuilder("x", 3))


def test_extend_appends_steps():
    a, b = ring.reduce_scatter(3, (1, 2, 3)), ring.allgather(3, (1, 2, 3))
    builder = ScheduleBuilder("both", 3)
    builder.extend(a)
    builder.extend(b)
    assert _rows(builder.build()) == _rows(a) + _rows(b)


# ---- the schedule object ------------------------------------------------------------------------------
def test_schedule_from_transfers_and_lazy_steps():
    steps = ((Transfer(0, 1, 0, 3, True), Transfer(1, 0, 3, 2, dst_offset=0, src_buf=1)), (),
             (Transfer(2, 2, 0, 1),), (Transfer(1, 2, 0, 0),), (Transfer(2, 0, 1, 1),))
    sched = Schedule("hand", 3, steps, {"k": 1})
    assert sched.num_steps == 2 and sched.meta == {"k": 1}
    assert sched.steps[0] == steps[0] and sched.steps[-1] == steps[4]
    assert sched.steps[:1] == (steps[0],) and list(sched.steps) == [steps[0], steps[4]]
    assert [s for s, _ in sched.transfers()] == [0, 0, 1]
    with pytest.raises(IndexError):
        sched.steps[2]
    with pytest.raises(IndexError):
        sched.step_arrays(2)
    arrays = sched.step_arrays(0)
    assert len(arrays) == 2 and arrays.recv_offset.tolist() == [0, 0] and arrays.reduce.tolist() == [True, False]


def test_schedule_is_immutable_and_hashed_by_identity():
    a, b = ring.allreduce.__wrapped__(4, 8), ring.allreduce.__wrapped__(4, 8)
    assert a != b and hash(a) != hash(b) and a == a and len({a, b}) == 2
    assert _rows(a) == _rows(b)
    with pytest.raises(AttributeError):
        a.name = "other"


@pytest.mark.parametrize("n", [0, 1, 5, 3 * (1 << 55) + 1])  # sums beyond 2**53: no float on the way
def test_bytes_sent_is_exact(n):
    # rank r sends chunks r (twice), r-1 and r+1: n + chunk r elements
    assert ring.allreduce(3, n).bytes_sent(8) == [8 * (n + c) if n else 0 for _, c in even_split(n, 3)]


# ---- caches bounded by bytes --------------------------------------------------------------------------
def test_size_bounded_cache_evicts_by_bytes_and_entries():
    cache = SizeBoundedCache(100, max_item_bytes=60, max_entries=3)
    assert cache.put("a", 1, 40) and cache.put("b", 2, 40)
    assert cache.get("a") == 1  # now b is the least recently used
    assert cache.put("c", 3, 40)  # 120 > 100: b goes
    assert cache.get("b") is None and cache.get("a") == 1 and cache.nbytes == 80
    assert not cache.put("huge", 4, 61) and cache.get("huge") is None
    for k in "def":
        cache.put(k, k, 1)
    assert len(cache) == 3
    cache.clear(lambda k: k == "f")
    assert cache.get("f") is None and len(cache) == 2
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


@pytest.mark.parametrize("kwargs", [{"max_bytes": 0}, {"max_bytes": 10, "max_item_bytes": 11},
                                    {"max_bytes": 10, "max_entries": 0}])
def test_size_bounded_cache_rejects_bad_bounds(kwargs):
    with pytest.raises(ValueError):
        SizeBoundedCache(**kwargs)


def test_memoised_builder_keeps_small_schedules_and_rebuilds_heavy_ones():
    build = memoise(SizeBoundedCache(10_000, max_item_bytes=5_000), lambda s, args: s.nbytes())(
        ring.allreduce.__wrapped__)
    small, big = build(4, 100), build(200, 1 << 20)
    assert build(4, 100) is small
    assert big.nbytes() > 5_000 and build(200, 1 << 20) is not big
    build.cache_clear()
    assert build(4, 100) is not small
