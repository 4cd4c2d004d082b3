"""Sufficient factors of fully connected layers (ringlet.torch.training.factors), in one process: which layers
qualify, when factoring pays, the per-rank guard, and the average computed from gathered rows against
the explicit sum of the ranks' gradients. The multi-process equivalence lives in
tests/workers/ddp_worker.py (case sufficient_factors)."""
import pytest
import torch
import torch.nn.functional as F

from ringlet.torch.training import factors


class Scaled(torch.nn.Linear):
    def forward(self, x):  # not nn.Linear's forward: its gradient need not factor
        return 2 * super().forward(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.plain = torch.nn.Linear(8, 16)
        self.scaled = Scaled(16, 16)
        self.frozen = torch.nn.Linear(16, 16)
        self.frozen.weight.requires_grad_(False)
        self.tied_a = torch.nn.Linear(16, 16)
        self.tied_b = torch.nn.Linear(16, 16)
        self.tied_b.weight = self.tied_a.weight
        self.seq = torch.nn.Sequential(torch.nn.Linear(16, 4))
        self.half = torch.nn.Linear(16, 16).to(torch.bfloat16)  # the row count must stay exact in the header


def test_eligible_layers_are_plain_untied_trainable_fp32_or_fp64_linears():
    m = Model()
    trainable = {id(p) for p in m.parameters() if p.requires_grad}
    names = [f.name for f in factors.eligible_linears(m, trainable)]
    assert names == ["plain", "seq.0"]


def test_the_guard_leaves_torchs_default_random_stream_alone():
    lin, layer = grads_and_factors(0, 4)
    d, a = layer.pairs[0]
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    assert factors._matches(lin.weight.grad, d, a, layer.generator)
    assert torch.equal(torch.rand(3), want)
    layer.remove()


@pytest.mark.parametrize("size, rows, m, n, expected", [
    (4, 32, 512, 4096, True),     # the CNN's first fully connected layer: 0.6 M gathered vs 2.1 M
    (4, 64, 512, 4096, True),     # ... on 64 rows: 1.2 M
    (4, 128, 512, 4096, False),   # ... on 128 rows: 2.4 M, more than the gradient
    (4, 32, 10, 512, False),      # its last layer: the factors are larger than the gradient
    (4, 4096, 4096, 4096, False),  # a transformer's MLP over 8 x 512 tokens
    (1, 32, 512, 4096, False),    # nothing to reduce
    (4, 0, 512, 4096, False),     # the layer saw no rows
])
def test_worth_factoring(size, rows, m, n, expected):
    assert factors.worth_factoring(size, rows, m, n) is expected


def grads_and_factors(model_seed: int, rows: int):
    torch.manual_seed(model_seed)
    lin = torch.nn.Linear(12, 5)
    layer = factors.FactoredLinear("lin", lin)
    layer.enabled = True
    x = torch.randint(-3, 4, (rows, 3, 12)).float()  # leading dims beyond the batch are rows too
    F.mse_loss(lin(x), torch.zeros(rows, 3, 5)).backward()
    return lin, layer


def test_capture_reproduces_the_local_gradient_and_the_guard_accepts_it():
    lin, layer = grads_and_factors(0, 4)
    pairs = layer.take_pairs()
    assert len(pairs) == 1 and pairs[0][0].shape == (12, 5) and pairs[0][1].shape == (12, 12)
    d = torch.cat([p[0] for p in pairs])
    a = torch.cat([p[1] for p in pairs])
    assert torch.allclose(d.t() @ a, lin.weight.grad, atol=1e-6)
    assert factors._matches(lin.weight.grad, d, a)
    assert not factors._matches(lin.weight.grad + 0.01, d, a)  # e.g. a .grad that held values before
    assert not factors._matches(None, d, a) and factors._matches(None, d[:0], a[:0])
    assert factors._matches(torch.zeros(5, 12), d[:0], a[:0]) and not factors._matches(torch.ones(5, 12), d[:0], a[:0])
    layer.remove()


def test_pairs_of_a_gradient_set_to_none_are_dropped_and_no_grad_forwards_add_nothing():
    lin, layer = grads_and_factors(0, 4)
    lin.weight.grad = None
    with torch.no_grad():
        lin(torch.ones(2, 12))
    assert len(layer.pairs) == 1  # a forward without autograd changes nothing
    F.mse_loss(lin(torch.ones(2, 12)), torch.zeros(2, 5)).backward()
    assert len(layer.pairs) == 1 and layer.pairs[0][1].shape == (2, 12)
    lin(torch.ones(2, 12))  # a forward whose output never reaches a backward adds no pair
    assert len(layer.pairs) == 1
    layer.remove()


@pytest.mark.parametrize("ranks, rows", [(2, [4, 4]), (3, [1, 0, 7]), (4, [5, 5, 5, 5])])
def test_average_from_gathered_rows_equals_the_mean_of_the_gradients(ranks, rows):
    grads, packs = [], []
    for r in range(ranks):
        torch.manual_seed(0)
        lin = torch.nn.Linear(12, 5)
        layer = factors.FactoredLinear("lin", lin)
        layer.enabled = True
        torch.manual_seed(100 + r)  # every rank its own batch
        x = torch.randint(-3, 4, (rows[r], 3, 12)).float()
        if rows[r]:
            F.mse_loss(lin(x), torch.zeros(rows[r], 3, 5), reduction="sum").backward()
        pairs = layer.take_pairs()
        layer.remove()
        grads.append(lin.weight.grad if lin.weight.grad is not None else torch.zeros(5, 12))
        d = torch.cat([p[0] for p in pairs]) if pairs else torch.zeros(0, 5)
        a = torch.cat([p[1] for p in pairs]) if pairs else torch.zeros(0, 12)
        pack = torch.zeros(1 + d.shape[0], 17)  # the layout gather_factors sends: header row, then [δ | x]
        pack[0, 0], pack[0, 1] = 1.0, float(d.shape[0])
        pack[1:, :5], pack[1:, 5:] = d, a
        packs.append(pack)
    rows_all = torch.cat(packs)
    spans, off = [], 0
    for p in packs:
        spans.append((off + 1, p.shape[0] - 1))
        off += p.shape[0]
    want = sum(grads) / ranks
    avg = factors.average_from_factors(("factors", rows_all.clone(), spans), 5, ranks)
    assert torch.allclose(avg, want, atol=1e-4), (avg - want).abs().max()
    out = torch.empty(5, 12)
    assert factors.average_from_factors(("factors", rows_all.clone(), spans), 5, ranks, out=out) is out
    assert torch.allclose(out, want, atol=1e-4)
    empty = ("factors", torch.zeros(ranks, 17), [(i + 1, 0) for i in range(ranks)])
    assert factors.average_from_factors(empty, 5, ranks) is None
    # On the factor worker (what the DDP uses): the same numbers, computed off the calling thread.
    out2 = torch.empty(5, 12)
    fut = factors.average_from_factors_async(("factors", rows_all.clone(), spans), 5, ranks, out2)
    assert fut.result(timeout=30) is out2 and torch.equal(out2, out)
    fut2 = factors.average_from_factors_async(("factors", rows_all.clone(), spans), 5, ranks)
    assert fut2.result(timeout=30) is not None
    assert factors._worker is not None and all(t.name.startswith("ringlet-factors") for t in factors._worker._threads)


def test_under_autocast_the_guard_allows_the_rounding_of_autograds_bf16_product_only():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    layer = factors.FactoredLinear("lin", lin)
    layer.enabled = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = lin(torch.randn(16, 64))
    F.mse_loss(out.float(), torch.zeros(16, 32)).backward()
    pairs = layer.take_pairs()
    layer.remove()
    assert pairs[0][0].dtype == torch.bfloat16 and lin.weight.grad.dtype == torch.float32
    tol = factors._tolerance(pairs)
    assert tol == 8 * torch.finfo(torch.bfloat16).eps
    assert factors._tolerance([(torch.zeros(1), torch.zeros(1))]) == factors._CHECK_RTOL
    d, a = (torch.cat([p[i] for p in pairs]).float() for i in (0, 1))
    assert factors._matches(lin.weight.grad, d, a, layer.generator, tol)
    assert not factors._matches(lin.weight.grad, d, a, layer.generator)  # fp32's tolerance: too tight here
    assert not factors._matches(lin.weight.grad * 1.5, d, a, layer.generator, tol)  # a missing third is caught


@pytest.mark.parametrize("rows, n", [(32, 4096), (4, 64)])
def test_the_guard_catches_a_stale_gradient_a_tenth_the_size_in_a_large_layer(rows, n):
    """The tolerance is relative to a random-sign sum of the terms, not to their absolute sum, which in
    a 512 x 4096 layer is hundreds of times larger and would hide a whole missing micro-batch."""
    torch.manual_seed(0)
    d, a = torch.randn(rows, 512), torch.randn(rows, n)
    grad = d.t() @ a
    gen = torch.Generator().manual_seed(1)
    assert factors._matches(grad, d, a, gen)
    stale = (torch.randn(rows, 512).t() @ torch.randn(rows, n)) * 0.1
    assert not factors._matches(grad + stale, d, a, gen)
    assert not factors._matches(grad + stale * 5, d, a, gen, 8 * torch.finfo(torch.bfloat16).eps)


def test_gathers_after_the_first_send_the_last_capacity_and_regather_when_a_rank_has_more_rows(monkeypatch):
    """Over in-process ranks: the first gather exchanges sizes; later ones send ``capacity`` rows padded,
    without that exchange, and one a rank overflows is done again by the actual sizes. Every step's
    average equals the mean of the ranks' gradients and every rank agrees on the capacity."""
    from conftest import run_world

    import ringlet

    p = 3
    plan = [[2, 3, 1], [2, 3, 1], [4, 1, 0], [1, 1, 1], [1, 0, 1]]  # rows per rank, step by step
    want_capacity = [3, 3, 4, 1, 1]
    from ringlet.torch.comm import Comm

    calls = []  # (rank, sizes given) per allgather
    gather = Comm.allgather

    def counting(self, t, *a, **k):
        calls.append((ringlet.rank(), k.get("sizes") is not None))
        return gather(self, t, *a, **k)

    monkeypatch.setattr(Comm, "allgather", counting)

    def fn(rank):
        out = []
        torch.manual_seed(0)
        layer = factors.FactoredLinear("lin", torch.nn.Linear(12, 5))
        for s, rows in enumerate(plan):
            torch.manual_seed(0)
            lin = torch.nn.Linear(12, 5)
            layer.module, layer.weight = lin, lin.weight  # the same capture state, a fresh gradient
            layer._handle.remove()
            layer._handle = lin.register_forward_hook(layer._forward_hook, prepend=True)
            layer.enabled = True
            torch.manual_seed(100 * s + rank)
            if rows[rank]:
                x = torch.randint(-3, 4, (rows[rank], 12)).float()
                F.mse_loss(lin(x), torch.zeros(rows[rank], 5), reduction="sum").backward()
            got = factors.gather_factors(layer, lin.weight.grad, layer.take_pairs(), Comm(), "lin")
            assert got[0] == "factors"
            avg = factors.average_from_factors(got, 5, p)
            grad = lin.weight.grad if lin.weight.grad is not None else torch.zeros(5, 12)
            out.append((avg if avg is not None else torch.zeros(5, 12), grad, layer.capacity))
        layer.remove()
        return out

    res = run_world(p, fn)
    for s in range(len(plan)):
        want = sum(res[r][s][1] for r in range(p)) / p
        for r in range(p):
            avg, _, cap = res[r][s]
            assert torch.allclose(avg, want, atol=1e-4), (s, r, (avg - want).abs().max())
            assert cap == want_capacity[s], (s, r, cap)
    # Per rank: step 0 by exchanged sizes, steps 1 and 3-4 sized only, step 2 sized then again.
    for r in range(p):
        assert [sized for rank, sized in calls if rank == r] == [False, True, True, False, True, True], calls


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_the_layers_chosen_are_those_whose_factors_are_fewer_numbers_than_the_gradient(mode):
    """sufficient_factors=True ("on") skips layers where factoring would only add a collective, as "auto"
    does; the two differ in whether the chosen layers are then timed against the dense reduction."""
    from ringlet.torch.training.factor_reduction import FactorLayers

    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4), torch.nn.Linear(64, 64))
    layers = FactorLayers(m, {id(p) for p in m.parameters()}, mode, allowed=True)
    assert [f.name for f in layers.layers] == ["0", "1", "2"]
    assert layers.on_trial is (mode == "auto")
    for f in layers.layers:
        f.rows = 4
    layers.layers[2].rows = 0  # saw no rows in the step that decides
    # On 3 ranks, 4 rows each: 3·4·128 = 1536 < 4096 numbers for 64 -> 64; 3·4·68 > 256 for 64 -> 4.
    flags = layers.wanted(3)
    assert flags == [1, 0, 0]
    chosen = layers.choose(flags)
    assert [f.name for f in chosen.values()] == ["0"] and [f.name for f in layers.layers] == ["0"]
    layers.drop()
    assert layers.chosen == {} and layers.layers == []


def test_no_layers_when_off_or_not_allowed():
    from ringlet.torch.training.factor_reduction import FactorLayers

    m = torch.nn.Linear(64, 64)
    assert FactorLayers(m, {id(m.weight)}, "off", allowed=True).layers == []
    assert FactorLayers(m, {id(m.weight)}, "on", allowed=False).layers == []
