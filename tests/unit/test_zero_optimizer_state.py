"""ZeroOptimizer's checkpoint interface (shard_state / load_shard_state, also into another world size;
the rank's own state_dict) and every bad argument."""
import pytest
import torch
import torch.nn.functional as F

from ringlet.torch.training.zero import ZeroOptimizer, ZeroOptions
from ringlet.torch.training.zero.state import CheckpointMismatch

from conftest import run_world
from zero_cases import Config, batch, flat_params, make_model, snapshot, train_zero


def stitch(states):
    """Every rank's ShardState stitched into full per-parameter tensors; a fetch over them."""
    full: dict[str, dict] = {}
    for st in states:
        for p in st.pieces:
            n = 1
            for d in p.shape:
                n *= d
            entry = full.setdefault(p.name, {"master": torch.full((n,), float("nan")), "state": {}})
            entry["master"][p.start:p.end] = p.master
            for k, v in p.state.items():
                if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == p.numel:
                    entry["state"].setdefault(k, torch.full((n,), float("nan"), dtype=v.dtype))[p.start:p.end] = v
                else:
                    entry["state"][k] = v

    def fetch(name, start, end):
        e = full[name]
        st = {k: (v[start:end].clone() if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() > 1 else v)
              for k, v in e["state"].items()}
        return e["master"][start:end].clone(), st
    return fetch


def continue_training(rank, zero, net, cfg, first, steps):
    for s in range(first, first + steps):
        x, y = batch(rank, s)
        F.mse_loss(net(x), y).backward()
        zero.step()
        zero.zero_grad()
    return snapshot(net, zero)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("opt", ["adam", "sgd"])
@pytest.mark.parametrize("worlds", [(2, 2), (2, 3), (4, 2), (3, 1)])
def test_shard_state_round_trip_any_world(stage, opt, worlds):
    before, after = worlds
    cfg = Config(stage=stage, opt=opt, steps=3, bucket_bytes=128)

    def first(rank):
        net, zero = train_zero(rank, cfg)
        st = zero.shard_state(extra={"step": 3})
        assert st.world == before and st.rank == rank and st.extra == {"step": 3}
        cont = continue_training(rank, zero, net, cfg, 3, 2)
        return st, cont
    out = run_world(before, first)
    fetch = stitch([o[0] for o in out])
    groups = out[0][0].groups

    def second(rank):
        cfg2 = Config(stage=stage, opt=opt, steps=0, bucket_bytes=96)
        net, zero = train_zero(rank, cfg2)
        zero.load_shard_state(fetch, groups)
        return continue_training(rank, zero, net, cfg2, 3, 2)
    resumed = run_world(after, second)
    # continuing on another world size averages over other ranks' data: compare the state, then a same-world run
    if before == after:
        assert all(torch.equal(r, out[0][1]) for r in resumed)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("stages", [(1, 2), (2, 3), (3, 1)])
def test_resharded_state_is_elementwise_equal(world, stages):
    cfg = Config(stage=stages[0], opt="adam", steps=2, bucket_bytes=128)
    out = run_world(2, lambda rank: (lambda nz: (nz[1].shard_state(), snapshot(*nz)))(train_zero(rank, cfg)))
    fetch = stitch([o[0] for o in out])

    def body(rank):
        net, zero = train_zero(rank, Config(stage=stages[1], steps=0, bucket_bytes=200))
        zero.load_shard_state(fetch)
        return zero.shard_state(), snapshot(net, zero)
    res = run_world(world, body)
    assert all(torch.equal(r[1], out[0][1]) for r in res)
    fetch2 = stitch([r[0] for r in res])
    for st in (o[0] for o in out):
        for p in st.pieces:
            m, s = fetch2(p.name, p.start, p.end)
            assert torch.equal(m, p.master)
            assert torch.equal(s["exp_avg"], p.state["exp_avg"]) and torch.equal(s["exp_avg_sq"], p.state["exp_avg_sq"])
            assert float(s["step"]) == float(p.state["step"]) == 2.0


def test_load_before_any_step_creates_state_and_mismatch_names_parameter():
    def body(rank):
        net, zero = train_zero(rank, Config(steps=0))
        assert not zero.state
        zero.load_shard_state(lambda name, a, b: (torch.zeros(b - a), {"exp_avg": torch.ones(b - a),
                                                                          "exp_avg_sq": torch.ones(b - a),
                                                                          "step": torch.tensor(5.0)}))
        assert all(float(st["step"]) == 5.0 and st["exp_avg"].shape == v.shape for v, st in zero.state.items())
        assert all(float(p.detach().abs().sum()) == 0 for p in net.parameters())
        with pytest.raises(CheckpointMismatch, match="fc"):
            zero.load_shard_state(lambda name, a, b: (torch.zeros(b - a + 1), {}))
        with pytest.raises(CheckpointMismatch, match="param groups"):
            zero.load_shard_state(lambda name, a, b: (torch.zeros(b - a), {}), groups=[{}, {}])
    run_world(2, body)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_own_state_dict_round_trip(stage):
    cfg = Config(stage=stage, steps=3)

    def body(rank):
        net, zero = train_zero(rank, cfg)
        sd = zero.state_dict()
        sd = {"zero": sd["zero"], "optimizer": _deep_clone(sd["optimizer"]), "master": sd["master"]}
        ref = continue_training(rank, zero, net, cfg, 3, 2)
        net2, zero2 = train_zero(rank, Config(stage=stage, steps=0))
        zero2.load_state_dict(sd)
        assert zero2.param_groups is zero2.optimizer.param_groups and zero2.state is zero2.optimizer.state
        return torch.equal(continue_training(rank, zero2, net2, cfg, 3, 2), ref), sd
    out = run_world(2, body)
    assert all(o[0] for o in out)

    def other(rank):
        _, zero = train_zero(rank, Config(stage=stage, steps=0))
        with pytest.raises(ValueError, match="same world size"):
            zero.load_state_dict(out[0][1])
        with pytest.raises(ValueError, match="not a ZeroOptimizer"):
            zero.load_state_dict({"state": {}})
    run_world(3, other)


def _deep_clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _deep_clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_deep_clone(v) for v in obj]
    return obj


# ---- bad arguments ------------------------------------------------------------------------------------------
def _raises(exc, match, *args, **kwargs):
    def body(rank):
        with pytest.raises(exc, match=match):
            ZeroOptimizer(*args, **kwargs)
    run_world(1, body)


@pytest.mark.parametrize("case", ["stage0", "stage4", "stagebool", "lbfgs", "instance", "notclass", "sparse",
                                  "twice", "empty", "none_trainable", "stage3_list", "tensor", "mixed",
                                  "intparam", "options", "nolist_group"])
def test_bad_arguments(case):
    net = make_model()
    ps = list(net.parameters())
    sgd = torch.optim.SGD
    cases = {
        "stage0": (ValueError, "stage must be", (sgd, net), {"stage": 0, "lr": 0.1}),
        "stage4": (ValueError, "stage must be", (sgd, net), {"stage": 4, "lr": 0.1}),
        "stagebool": (ValueError, "stage must be", (sgd, net), {"stage": True, "lr": 0.1}),
        "lbfgs": (ValueError, "LBFGS", (torch.optim.LBFGS, net), {}),
        "instance": (TypeError, "the class", (sgd(ps, lr=0.1), net), {}),
        "notclass": (TypeError, "Optimizer subclass", (dict, net), {}),
        "sparse": (ValueError, "sparse", (sgd, torch.nn.Embedding(5, 3, sparse=True)), {"lr": 0.1}),
        "twice": (ValueError, "given twice", (sgd, [ps[0], ps[1], ps[0]]), {"lr": 0.1}),
        "empty": (ValueError, "empty parameter list", (sgd, []), {"lr": 0.1}),
        "none_trainable": (ValueError, "no trainable", (sgd, torch.nn.Linear(2, 2).requires_grad_(False)), {"lr": 0.1}),
        "stage3_list": (TypeError, "stage=3", (sgd, ps), {"stage": 3, "lr": 0.1}),
        "tensor": (TypeError, "single tensor", (sgd, ps[0]), {"lr": 0.1}),
        "mixed": (TypeError, "mixes", (sgd, [{"params": ps[:1]}, ps[1]]), {"lr": 0.1}),
        "intparam": (TypeError, "floating", (sgd, [torch.zeros(3, dtype=torch.int64)]), {"lr": 0.1}),
        "options": (TypeError, "ZeroOptions", (sgd, net), {"options": {"bucket_bytes": 5}, "lr": 0.1}),
        "nolist_group": (ValueError, "no 'params'", (sgd, [{"lr": 0.1}]), {"lr": 0.1}),
    }
    exc, match, args, kwargs = cases[case]
    _raises(exc, match, *args, **kwargs)


@pytest.mark.parametrize("kw, exc, match", [({"bucket_bytes": 0}, ValueError, "bucket_bytes"),
                                            ({"max_inflight": 0}, ValueError, "max_inflight"),
                                            ({"partition": "even"}, TypeError, "Partition"),
                                            ({"reduce_dtype": torch.int32}, TypeError, "reduce_dtype"),
                                            ({"reducer": object()}, TypeError, "reducer")])
def test_bad_options(kw, exc, match):
    with pytest.raises(exc, match=match):
        ZeroOptions(**kw)


def test_add_param_group_refused_and_sparse_grad_refused():
    def body(rank):
        net = make_model()
        zero = ZeroOptimizer(torch.optim.SGD, net, lr=0.1)
        with pytest.raises(NotImplementedError, match="fixed at construction"):
            zero.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})
        net.scale.grad = torch.zeros(1).to_sparse()
        with pytest.raises(ValueError, match="sparse gradient"):
            zero.step()
    run_world(1, body)
