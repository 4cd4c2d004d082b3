"""Priority scheduling in ringlet's DDP, in one process (ranks as threads): the Priority strategy's
checks, the piece layout, the choice rule, the order pieces go out in, and the overlap of the next
forward giving the synchronous DDP's parameters bit for bit. The same equivalences over real processes
live in tests/workers/priority_worker.py (test_priority_processes.py)."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import run_world
from prio_models import SMALL, data, flat, make_model, make_optimizer, overlapped, train

from ringlet.torch.training import DistributedDataParallel, Priority
from ringlet.torch.training.buckets import BucketSet
from ringlet.torch.training.piece_round import choose_order
from ringlet.torch.training.pieces import piece_layout, plan_bucket, spacing, split_even
from ringlet.torch.training.reduction import DenseReduction



# ---- the strategy object --------------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [(1, 1), (4096, 4096), ("1M", 1 << 20), ("512K", 512 << 10),
                                             ("65536", 65536)])
def test_partition_bytes_accepts_ints_and_sizes(value, expected):
    assert Priority(partition_bytes=value).partition_bytes == expected


@pytest.mark.parametrize("value, error", [(0, ValueError), (-5, ValueError), ("0", ValueError), ("lots", ValueError),
                                          (True, TypeError), (1.5, TypeError), (None, TypeError)])
def test_partition_bytes_refuses_bad_values(value, error):
    with pytest.raises(error, match="partition_bytes"):
        Priority(partition_bytes=value)


def test_priority_must_be_a_priority():
    def fn(rank):
        with pytest.raises(TypeError, match="priority must be"):
            DistributedDataParallel(make_model(), priority="front-first")
        return True

    assert run_world(2, fn) == [True, True]


# ---- pieces ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, k", [(0, 1), (1, 1), (7, 3), (13, 13), (1_000_003, 17)])
def test_split_even_covers_the_range_in_near_equal_parts(n, k):
    parts = split_even(n, k)
    assert len(parts) == k and parts[0][0] == 0 and parts[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert max(b - a for a, b in parts) - min(b - a for a, b in parts) <= 1


def dense_set(sizes, partition):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    layout = [params[:1], params[1:]] if len(params) > 1 else [params]
    return BucketSet(layout, lambda ps: DenseReduction(None), lambda lay, reds: spacing(lay, reds, partition))


@pytest.mark.parametrize("sizes", [[0], [1], [0, 3, 0], [7, 11, 13], [100_003, 1, 5], [2, 2, 2, 2, 2, 2, 2]])
@pytest.mark.parametrize("partition", [1, 4, 28, 1 << 30])
def test_piece_layout_packs_parameters_and_leaves_gaps_for_the_control_vector(sizes, partition):
    bucket_set = dense_set(sizes, partition)
    layout = piece_layout(bucket_set, partition)
    gap = 2 * len(layout.pieces)
    for b in bucket_set.buckets:
        mine = [layout.pieces[i] for i in layout.of_bucket[b.index]]
        data = [(b.offsets[j], b.offsets[j] + p.numel()) for j, p in enumerate(b.params) if p.numel()]
        covered = sorted((q.lo, q.hi) for q in mine)
        assert sum(hi - lo for lo, hi in covered) == sum(hi - lo for lo, hi in data)  # every element once
        for q in mine:
            assert q.nbytes <= max(partition, 4)  # a piece holds at most partition bytes (one element at least)
            for j, p in enumerate(b.params):   # each overlapping parameter lies in one piece or spans whole pieces
                lo, hi = b.offsets[j], b.offsets[j] + p.numel()
                assert (j in q.slots) == (lo < q.hi and hi > q.lo)
            if q.carries:                       # its control vector sits in a gap no parameter uses
                assert q.hi + gap <= b.buffer.numel()
                assert all(hi <= q.hi or lo >= q.hi + gap for lo, hi in data)
        assert [layout.of_slot[b.index][j] for j in range(len(b.params))] == [
            [q.index for q in mine if j in q.slots] for j in range(len(b.params))]
    assert [q.index for q in layout.pieces] == list(range(len(layout.pieces)))


@pytest.mark.parametrize("sizes, itemsize, partition, expected", [
    ([3, 3, 3], 4, 24, [(0, 6, True), (6, 9, True)]),              # packed up to the partition
    ([10], 4, 16, [(0, 3, False), (3, 6, False), (6, 10, True)]),    # a large parameter: pieces of its own
    ([1, 10, 1], 4, 16, [(0, 1, True), (1, 4, False), (4, 7, False), (7, 11, True), (11, 12, True)]),
    ([0, 0], 4, 16, []),
    ([], 4, 16, []),
])
def test_plan_bucket(sizes, itemsize, partition, expected):
    assert plan_bucket(sizes, itemsize, partition) == expected


def test_a_bucket_set_built_without_the_gaps_is_refused():
    params = [torch.nn.Parameter(torch.zeros(8))]
    with pytest.raises(RuntimeError, match="not built for priority"):
        piece_layout(BucketSet([params], lambda ps: DenseReduction(None)), 16)


@pytest.mark.parametrize("some, every, chosen, credit, expected", [
    ([1, 1, 1], [1, 1, 1], [0, 0, 0], 99, [2, 1, 0]),  # everything ready everywhere: front pieces first
    ([1, 1, 1], [1, 1, 1], [0, 0, 0], 25, [2, 1]),     # ... as many as the credit allows
    ([1, 1, 1], [1, 1, 1], [0, 0, 0], 1, [2]),         # ... but at least one
    ([1, 1, 1], [1, 1, 0], [0, 0, 0], 99, [1, 0]),     # the front one is not ready on every rank yet
    ([1, 1, 1], [1, 1, 1], [0, 1, 1], 99, [0]),
    ([0, 1, 1], [0, 0, 0], [0, 0, 0], 99, [1]),        # ready nowhere in full: the earliest ready somewhere
    ([0, 1, 1], [0, 0, 0], [0, 1, 0], 99, [2]),
    ([0, 0, 0], [0, 0, 0], [0, 0, 0], 99, []),
    ([1, 1, 1], [1, 1, 1], [1, 1, 1], 99, []),
    ([], [], [], 99, []),
])
def test_choose_order(some, every, chosen, credit, expected):
    flags = [[bool(x) for x in v] for v in (some, every, chosen)]
    assert choose_order(*flags, [10] * len(chosen), credit) == expected


# ---- the order on the wire ---------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [2, 3])
def test_pieces_ready_together_go_out_front_first(p):
    """With the communication thread held until backward is over, every piece is ready at the first
    agreement: they go out in exactly descending priority (front layers first)."""
    def fn(rank):
        net = make_model()
        ddp = DistributedDataParallel(net, bucket_cap_mb=0.002, first_bucket_cap_mb=0.001, tune=False,
                                      priority=Priority(partition_bytes=SMALL))
        opt = ddp.overlap_optimizer(make_optimizer("sgd", net.parameters()))
        orders = []
        for s in range(3):
            opt.zero_grad()
            x, y = data(rank, s)
            loss = F.mse_loss(ddp(x), y)
            gate = threading.Event()
            ddp._comm.submit(lambda: gate.wait(30))  # after the forward: its rebuild broadcasts on the queue
            loss.backward()
            opt.step()
            gate.set()
            ddp.synchronize()
            orders.append(list(ddp._launch.round.order))
        return orders, len(ddp._launch.layout.pieces)

    for orders, n in run_world(p, fn):
        assert n > 4
        assert orders == [list(reversed(range(n)))] * 3


# ---- the same parameters as the synchronous DDP --------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("opt", ["sgd", "adam", "adamw"])
def test_overlap_gives_the_synchronous_parameters(p, opt):
    def fn(rank):
        fifo, _, _ = train(rank, 5, opt=opt)
        prio, _, _ = train(rank, 5, opt=opt, partition=SMALL)
        over, _, ddp = train(rank, 5, opt=opt, partition=SMALL, overlap=True)
        whole, _, _ = train(rank, 5, opt=opt, partition=1 << 30, overlap=True)
        return fifo, prio, over, whole, len(ddp._launch.layout.pieces)

    res = run_world(p, fn)
    for fifo, prio, over, whole, n in res:
        assert n > 4
        assert torch.equal(over, prio)                   # overlap changes when, not what
        assert torch.equal(whole, fifo)                  # the same buckets as FIFO: bit for bit
        assert float((prio - fifo).abs().max()) < 1e-6   # pieces sum in another order at most
        assert torch.equal(over, res[0][2])              # every rank agrees


@pytest.mark.parametrize("micro", [2, 3])
def test_overlap_with_no_sync_accumulation(micro):
    def fn(rank):
        fifo, _, _ = train(rank, 3, micro=micro)
        over, _, _ = train(rank, 3, micro=micro, partition=1 << 30, overlap=True)
        return torch.equal(fifo, over)

    assert all(run_world(2, fn))


def test_eval_forwards_between_steps_see_the_updated_parameters():
    def fn(rank):
        _, fifo, _ = train(rank, 4, eval_every=1)
        _, over, _ = train(rank, 4, eval_every=1, partition=1 << 30, overlap=True)
        return all(torch.equal(a, b) for a, b in zip(fifo, over)) and len(over) == 4

    assert all(run_world(2, fn))


@pytest.mark.parametrize("view", [False, True])
def test_overlap_with_gradients_as_bucket_views_and_zero_grad_to_zeros(view):
    def fn(rank):
        def run(overlap):
            net = make_model()
            ddp = DistributedDataParallel(net, bucket_cap_mb=0.002, tune=False, gradient_as_bucket_view=view,
                                          priority=Priority(partition_bytes=1 << 30))
            opt = make_optimizer("sgd", net.parameters())
            if overlap:
                ddp.overlap_optimizer(opt)
            for s in range(4):
                x, y = data(rank, s)
                F.mse_loss(ddp(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
            ddp.synchronize()
            return flat(net)
        return torch.equal(run(False), run(True))

    assert all(run_world(2, fn))


def test_a_learning_rate_schedule_applies_to_the_step_it_was_set_for():
    def fn(rank):
        def run(overlap):
            net = make_model()
            ddp = DistributedDataParallel(net, bucket_cap_mb=0.002, tune=False, priority=Priority(1 << 30))
            opt = make_optimizer("sgd", net.parameters())
            if overlap:
                ddp.overlap_optimizer(opt)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            for s in range(4):
                opt.zero_grad()
                x, y = data(rank, s)
                F.mse_loss(ddp(x), y).backward()
                opt.step()
                sched.step()  # changes lr before the deferred update lands
            ddp.synchronize()
            return flat(net)
        return torch.equal(run(False), run(True))

    assert all(run_world(2, fn))


def test_two_optimizers_and_calls_that_cannot_be_deferred():
    """Two optimizers on disjoint parameters; zero_grad before step (discards the gradients) and a second
    step on the same gradients fall back to the synchronous order: the same parameters either way."""
    def fn(rank):
        def run(overlap):
            net = make_model()
            ddp = DistributedDataParallel(net, bucket_cap_mb=0.002, tune=False, priority=Priority(1 << 30))
            first = list(net.a.parameters()) + list(net.b.parameters())
            rest = [q for q in net.parameters() if q.requires_grad and all(q is not f for f in first)]
            opts = [torch.optim.SGD(first, lr=0.05, momentum=0.9), torch.optim.Adam(rest, lr=0.01)]
            if overlap:
                for o in opts:
                    ddp.overlap_optimizer(o)
            for s in range(4):
                x, y = data(rank, s)
                F.mse_loss(ddp(x), y).backward()
                if s == 1:
                    opts[0].zero_grad()  # before step: this step updates nothing with SGD's gradients
                for o in opts:
                    o.step()
                if s == 2:
                    opts[1].step()       # a second step on the same gradients
                for o in opts:
                    o.zero_grad()
            ddp.synchronize()
            return flat(net)
        return torch.equal(run(False), run(True))

    assert all(run_world(2, fn))


def test_state_dict_lands_the_pending_update():
    def fn(rank):
        fifo, _, _ = train(rank, 2)
        net = make_model()
        ddp, opt = overlapped(net)
        for s in range(2):
            opt.zero_grad()
            x, y = data(rank, s)
            F.mse_loss(ddp(x), y).backward()
            opt.step()
        state = net.state_dict()  # no synchronize(): the state dict hook lands the update
        saved = torch.cat([v.reshape(-1) for k, v in state.items()])
        return torch.equal(saved, fifo), opt.state_dict()["state"] != {}

    assert run_world(2, fn) == [(True, True)] * 2


def test_ranks_out_of_step_still_agree():
    """Ranks whose gradients arrive at different times (a random sleep in a hook on each rank) still send
    the same pieces in the same order and end with the synchronous parameters."""
    def fn(rank):
        fifo, _, _ = train(rank, 4)
        gen = torch.Generator().manual_seed(rank)
        net = make_model()
        ddp = DistributedDataParallel(net, bucket_cap_mb=0.002, first_bucket_cap_mb=0.001, tune=False,
                                      priority=Priority(SMALL))
        def lag(_):
            threading.Event().wait(float(torch.rand(1, generator=gen)) * 0.01)

        for q in net.parameters():
            if q.requires_grad:
                q.register_post_accumulate_grad_hook(lag)
        opt = ddp.overlap_optimizer(make_optimizer("sgd", net.parameters()))
        orders = []
        for s in range(4):
            opt.zero_grad()
            x, y = data(rank, s)
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            ddp.synchronize()
            orders.append(ddp._launch.round.order)
        return float((flat(net) - fifo).abs().max()), orders

    res = run_world(3, fn)
    assert all(d < 1e-6 for d, _ in res)
    assert all(orders == res[0][1] for _, orders in res)


# ---- other bucket kinds as whole pieces ------------------------------------------------------------------------
def test_compressed_buckets_are_whole_pieces_with_the_same_result():
    def fn(rank):
        fifo, _, _ = train(rank, 3, compression="fp16")
        over, _, ddp = train(rank, 3, compression="fp16", partition=SMALL, overlap=True)
        return torch.equal(fifo, over), all(q.whole for q in ddp._launch.layout.pieces)

    assert run_world(2, fn) == [(True, True)] * 2


def test_weights_from_sufficient_factors_are_whole_pieces():
    def fn(rank):
        fifo, _, a = train(rank, 4, width=64, sufficient_factors=True)
        over, _, b = train(rank, 4, width=64, sufficient_factors=True, partition=SMALL, overlap=True)
        whole = [q.bucket.reduction.factored for q in b._launch.layout.pieces if q.whole]
        return float((fifo - over).abs().max()), a.factored, b.factored, whole, b.factored_reductions

    for diff, fa, fb, whole, count in run_world(2, fn):
        assert fa == fb and fb and whole and all(whole) and count > 0
        assert diff < 1e-5


# ---- refusals -----------------------------------------------------------------------------------------------------
def test_overlap_optimizer_refusals():
    def fn(rank):
        net = make_model()
        opt = make_optimizer("sgd", net.parameters())
        with pytest.raises(ValueError, match="needs DistributedDataParallel"):
            DistributedDataParallel(net, tune=False).overlap_optimizer(opt)
        with pytest.raises(ValueError, match="find_unused_parameters"):
            DistributedDataParallel(make_model(), tune=False, find_unused_parameters=True,
                                    priority=Priority()).overlap_optimizer(opt)
        ddp = DistributedDataParallel(net, tune=False, priority=Priority())
        with pytest.raises(TypeError, match="torch.optim.Optimizer"):
            ddp.overlap_optimizer(object())
        with pytest.raises(ValueError, match="LBFGS"):
            ddp.overlap_optimizer(torch.optim.LBFGS(net.parameters()))
        ddp.overlap_optimizer(opt)
        with pytest.raises(ValueError, match="added already"):
            ddp.overlap_optimizer(opt)
        with pytest.raises(ValueError, match="shares parameters"):
            ddp.overlap_optimizer(torch.optim.SGD(net.a.parameters(), lr=0.1))
        return True

    assert run_world(2, fn) == [True, True]


class Borrower(torch.nn.Module):
    """Reads ``lender``'s weight outside ``lender``'s forward (which never runs)."""

    def __init__(self):
        super().__init__()
        self.lender = torch.nn.Linear(8, 4)

    def forward(self, x):
        return F.linear(x, self.lender.weight, self.lender.bias)


def test_a_parameter_read_outside_its_module_is_an_error():
    def fn(rank):
        net = Borrower()
        ddp = DistributedDataParallel(net, tune=False, priority=Priority())
        opt = ddp.overlap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
        x, y = data(rank, 0)
        F.mse_loss(ddp(x), y).backward()
        opt.step()
        with pytest.raises(RuntimeError, match="lender.weight"):
            ddp(x)
        return True

    assert run_world(2, fn) == [True, True]


def test_priority_after_hvd_init_is_accepted_and_sends_pieces():
    """The DDP's scheduler is its own choice (the ordered queue), so hvd.init() in the process changes
    nothing: priority= works as without it (tests/unit/test_ddp_after_hvd_init.py compares the results)."""
    from hvd_world import hvd_world

    def fn(rank):
        over, _, ddp = train(rank, 2, partition=SMALL, overlap=True)
        return not ddp._comm.coordinated and len(ddp._launch.layout.pieces) > 1, over

    res = hvd_world(2, fn)
    assert all(ok for ok, _ in res) and torch.equal(res[0][1], res[1][1])


def test_find_unused_parameters_with_priority_and_no_overlap():
    def fn(rank):
        def run(partition):
            net = make_model()
            extra = torch.nn.Linear(4, 4)  # never used: its gradient stays None on every rank
            with torch.no_grad():
                extra.weight.fill_(0.5)
                extra.bias.fill_(0.25)
            net.add_module("unused", extra)
            ddp = DistributedDataParallel(net, bucket_cap_mb=0.002, tune=False, find_unused_parameters=True,
                                          priority=None if partition is None else Priority(partition))
            opt = make_optimizer("sgd", net.parameters())
            for s in range(3):
                opt.zero_grad()
                x, y = data(rank, s)
                F.mse_loss(ddp(x), y).backward()
                opt.step()
            return flat(net), extra.weight.grad is None
        return run(None), run(SMALL)

    for (fifo, none_a), (prio, none_b) in run_world(2, fn):
        assert torch.equal(fifo, prio) and none_a and none_b


# ---- the round's own errors (a stand-in for the communication) --------------------------------------------------
class LoopbackComm:
    """One rank's Comm: all-reduces leave the tensor as it is, ``forced`` (if set) overwrites the first
    agreement's vector; jobs run at once on the calling thread."""

    def __init__(self, forced=None):
        self.forced = forced

    def allreduce_(self, t, op, name, **kw):
        if self.forced is not None and name.endswith("agree"):
            t.copy_(self.forced)
            self.forced = None
        fut = torch.futures.Future()
        fut.set_result(t)
        return fut

    def submit(self, fn, timed=False):
        fn()


def one_bucket_round(comm, timeout=5.0):
    from ringlet.torch.training.piece_round import Round

    bucket_set = dense_set([10, 30], 40)  # 160 bytes in pieces of at most 40: 4 pieces
    layout = piece_layout(bucket_set, 40)
    return Round(layout, comm, "auto", timeout, 40), layout


def test_a_round_sends_its_pieces_front_first_when_all_are_ready():
    rnd, layout = one_bucket_round(LoopbackComm())
    rnd.mark_ready([(i, None) for i in range(4)])  # as if backward had filled everything at once
    assert rnd.order == [3, 2, 1, 0] and all(f.done() for f in rnd.futures)


def test_an_agreement_with_nothing_ready_is_an_error():
    rnd, _ = one_bucket_round(LoopbackComm())
    rnd._comm.submit(rnd._slot)  # a slot without a ready piece anywhere: the ranks disagree on something
    with pytest.raises(RuntimeError, match="no piece is ready"):
        rnd.wait(0)


def test_a_piece_chosen_elsewhere_that_never_arrives_times_out():
    from ringlet.types import CollectiveTimeout

    forced = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0], dtype=torch.float32)  # piece 3 ready on every other rank
    rnd, _ = one_bucket_round(LoopbackComm(forced), timeout=0.05)
    rnd.mark_ready([(0, None)])
    with pytest.raises(CollectiveTimeout, match="piece 3"):
        rnd.wait(3)
    with pytest.raises(CollectiveTimeout):
        rnd.wait(0)  # the round stopped: every waiter hears of it
