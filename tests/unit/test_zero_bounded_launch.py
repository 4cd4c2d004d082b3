"""ZeRO's gradient reduction on the one bucket reducer: ScatterReduction under BoundedLaunch. Buckets driven
in adversarial arrival orders keep the working buffers within the declared bound (``max_inflight`` buckets
in the travelling dtype), launch in the order every rank shares, and fold the right blocks into the shards."""
import itertools
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from ringlet.torch.training.buckets import BucketSet
from ringlet.torch.training.launch_bounded import BoundedLaunch
from ringlet.torch.training.reducer import BucketReducer
from ringlet.torch.training.reduction import DenseReduction, ReductionContext
from ringlet.torch.training.zero import ZeroOptimizer, ZeroOptions
from ringlet.torch.training.zero.layout import Layout
from ringlet.torch.training.zero.scatter import ScatterReduction, Working, bucket_set

from conftest import run_world

SIZES = [7, 300, 2, 64, 900, 5, 128, 33]   # elements per bucket: the large ones arrive first in some orders


class _Future:
    def __init__(self, fake, flat, counts):
        self.fake, self.flat, self.counts = fake, flat, counts

    def wait(self):
        self.fake.inflight -= 1
        return self.flat[:self.counts[0]].to(torch.float32) * 2  # rank 0's block, "averaged" recognisably


class _FakeReducer:
    """ZeRO's reducer interface for shard rank 0; records launches, in-flight count and the working bytes
    at every launch."""

    def __init__(self, working: Working, bound: int):
        self.working, self.bound = working, bound
        self.inflight = self.most = 0
        self.names: list[str] = []

    def reduce_scatter_(self, flat, counts, name, state=None, *, check=False):
        assert self.working.current <= self.bound, (self.working.current, self.bound)
        self.inflight += 1
        self.most = max(self.most, self.inflight)
        self.names.append(name)
        return _Future(self, flat, counts)


def _setup(k: int, reduce_dtype, dtype=torch.float32, order=None, world: int = 2):
    named = [(f"p{i}", torch.zeros(n, dtype=dtype)) for i, n in enumerate(SIZES)]
    layout = Layout.units(named, [0] * len(named), world, [[i] for i in range(len(named))])
    options = SimpleNamespace(reduce_dtype=reduce_dtype, max_inflight=k)
    travel = reduce_dtype or dtype
    bound = k * max(b.numel for b in layout.buckets) * travel.itemsize
    working = Working()
    fake = _FakeReducer(working, bound)
    shards = [torch.zeros(b.counts[0]) for b in layout.buckets]
    red = ScatterReduction(fake, layout, shards, [{} for _ in layout.buckets], options, "z", working)
    bset = bucket_set(layout, [p for _, p in named], red)
    n = len(layout.buckets)
    reducer = BucketReducer(BoundedLaunch(range(n - 1, -1, -1) if order is None else order, k),
                            lambda p: "?", "ZeroOptimizer (test)")
    return SimpleNamespace(layout=layout, bound=bound, working=working, fake=fake, shards=shards, red=red,
                           bset=bset, reducer=reducer, named=named)


def _orders():
    n = len(SIZES)
    rng = random.Random(7)
    yield list(range(n))                    # exactly against the launch order (reverse index)
    yield sorted(range(n), key=lambda b: -SIZES[b])   # the largest buckets first
    for _ in range(6):
        yield rng.sample(range(n), n)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("reduce_dtype", [None, torch.bfloat16])
def test_whole_buckets_in_adversarial_order_stay_within_the_bound(k, reduce_dtype):
    for arrival in _orders():
        s = _setup(k, reduce_dtype)
        grads = {b: torch.arange(SIZES[b], dtype=torch.float32) + b for b in range(len(SIZES))}
        for step in range(2):  # the shards accumulate over backwards
            s.reducer.start(s.bset, [False] * len(s.bset.params))
            for b in arrival[:-2]:
                s.reducer.ready_bucket(s.bset.buckets[b], grads[b].clone())
                assert not s.red._given  # nothing held back outside the count
                assert s.fake.inflight <= k
            s.reducer.complete()  # the last two never arrive: zeros, launched in order
            s.reducer.wait()
            s.reducer.deliver()
        assert s.working.peak <= s.bound and s.working.current == 0 and s.fake.most <= k
        assert s.fake.names[:len(arrival) - 2] == [f"z.rs{b}" for b in arrival[:-2]]
        late = [b for b in range(len(SIZES) - 1, -1, -1) if b in arrival[-2:]]
        assert s.fake.names[len(arrival) - 2:len(arrival)] == [f"z.rs{b}" for b in late]
        for b, shard in enumerate(s.shards):
            travel = grads[b].to(reduce_dtype or torch.float32)[:shard.numel()].float()
            want = 4 * travel if b in arrival[:-2] else torch.zeros_like(shard)
            assert torch.equal(shard, want), b


@pytest.mark.parametrize("k", [1, 2])
def test_per_parameter_buckets_launch_in_order_within_the_bound(k):
    n = len(SIZES)
    for arrival in itertools.islice(_orders(), 4):
        s = _setup(k, None, order=list(range(n)))
        s.reducer.start(s.bset, [False] * n)
        for b in arrival:
            p = s.named[b][1]
            p.grad = torch.full_like(p, float(b + 1))
            s.reducer.ready(p, p.grad)
            assert s.fake.inflight <= k
        s.reducer.complete()
        s.reducer.wait()
        assert s.fake.names == [f"z.rs{b}" for b in range(n)]
        assert s.working.peak <= s.bound and s.working.current == 0
        assert all(p.grad is None for _, p in s.named)
        for b, shard in enumerate(s.shards):
            assert torch.equal(shard, torch.full_like(shard, 2.0 * (b + 1)))


def test_reducer_refuses_a_bucket_twice_and_a_strategy_without_whole_buckets():
    s = _setup(2, None)
    s.reducer.start(s.bset, [False] * len(s.bset.params))
    b = s.bset.buckets[3]
    s.reducer.ready_bucket(b, torch.zeros(SIZES[3]))
    with pytest.raises(RuntimeError, match="bucket 3's gradient arrived twice in one backward"):
        s.reducer.ready_bucket(b, torch.zeros(SIZES[3]))
    with pytest.raises(ValueError, match="expected"):
        s.reducer.ready_bucket(s.bset.buckets[2], torch.zeros(SIZES[2] + 1))
    with pytest.raises(ValueError, match="sparse gradient"):
        p = s.named[1][1]
        s.reducer.ready(p, torch.zeros(SIZES[1]).to_sparse())
    s.reducer.complete()
    s.reducer.wait()
    assert s.working.current == 0

    p = torch.nn.Parameter(torch.zeros(3))
    dense = BucketSet([[p]], lambda ps: DenseReduction(ReductionContext(None, "t", False)))
    other = BucketReducer(BoundedLaunch([0], 1), lambda q: "p", "test")
    other.start(dense, [True])
    with pytest.raises(TypeError, match="per parameter"):
        other.ready_bucket(dense.buckets[0], torch.zeros(3))
    with pytest.raises(ValueError, match="permutation"):
        BoundedLaunch([0, 0], 1).start(dense, None)
    with pytest.raises(ValueError, match="limit"):
        BoundedLaunch([0], 0)


class _Reversed(torch.nn.Module):
    """Units registered a, b, c, d but run d, c, b, a: backward completes a first, the bucket launched last
    in the fixed order (reverse unit index), so every unit arrives early."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 4), torch.nn.Linear(32, 16)
        self.c, self.d = torch.nn.Linear(8, 32), torch.nn.Linear(6, 8)

    def forward(self, x):
        return self.a(torch.tanh(self.b(torch.tanh(self.c(torch.tanh(self.d(x)))))))


@pytest.mark.parametrize("k", [1, 2])
def test_stage3_early_units_counted_within_the_declared_bound(k):
    def body(rank):
        torch.manual_seed(0)
        net = _Reversed()
        zero = ZeroOptimizer(torch.optim.SGD, net, stage=3, options=ZeroOptions(max_inflight=k), lr=0.1)
        for step in range(2):
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(10 * rank + step))
            F.mse_loss(net(x), torch.zeros(5, 4)).backward()
            zero.step()
            zero.zero_grad()
        mem = zero.memory()
        largest = max(b.numel for b in zero.layout.buckets) * 4
        assert 0 < mem["buffers"] <= k * largest <= mem["buffers_bound"] and mem["buffers_now"] == 0
        zero.close()
    run_world(2, body)
