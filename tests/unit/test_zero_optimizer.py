"""ZeroOptimizer stages 1 and 2 in-process (ranks as threads): equivalence with plain training on the
concatenated batch, bitwise agreement of the ranks, mixed precision, the loss scaler, memory accounting."""
import pytest
import torch
import torch.nn.functional as F

from ringlet.torch.training import GradScaler
from ringlet.torch.training.zero import Even, WholeParameters, ZeroOptimizer, ZeroOptions

from conftest import run_world
from zero_cases import (Config, NormSGD, batch, flat_params, make_model, max_diff, scaler_run, snapshot,
                        train_plain, train_zero)

TOL = 1e-6


def run_cfg(world: int, cfg: Config):
    def body(rank):
        net, zero = train_zero(rank, cfg)
        return flat_params(net), zero.memory()
    return run_world(world, body)


def assert_identical(results):
    for params, _ in results[1:]:
        assert torch.equal(params, results[0][0])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("opt", ["adam", "sgd"])
@pytest.mark.parametrize("micro", [1, 2])
def test_equals_plain_training(world, stage, opt, micro):
    cfg = Config(stage=stage, opt=opt, micro=micro)
    results = run_cfg(world, cfg)
    assert_identical(results)
    ref = flat_params(train_plain(world, cfg))
    assert max_diff(results[0][0], ref) <= TOL
    assert max_diff(results[0][0], flat_params(make_model())) > 1e-3  # it trained


@pytest.mark.parametrize("world", [2, 3])
def test_stages_agree_bitwise(world):
    one = run_cfg(world, Config(stage=1))
    two = run_cfg(world, Config(stage=2))
    assert torch.equal(one[0][0], two[0][0])


@pytest.mark.parametrize("cfg", [Config(scheduler=True), Config(stage=2, unused=True, opt="adamw"),
                                 Config(stage=1, unused=True, opt="sgd"), Config(opt="norm"),
                                 Config(stage=2, opt="norm", micro=2), Config(bucket_bytes=1 << 20),
                                 Config(stage=2, bucket_bytes=1, options={"max_inflight": 1}),
                                 Config(clip=0.5), Config(stage=2, micro=2, clip=0.3, opt="sgd")], ids=Config.label)
def test_variants_equal_plain_training(cfg):
    results = run_cfg(3, cfg)
    assert_identical(results)
    assert max_diff(results[0][0], flat_params(train_plain(3, cfg))) <= TOL


def test_non_elementwise_optimizer_gets_whole_parameters():
    def body(rank):
        net, zero = train_zero(rank, Config(opt="norm", steps=1))
        assert isinstance(zero.layout.partition, WholeParameters)
        shapes = {tuple(s.shape) for g in zero.param_groups for s in g["params"]}
        names = {p.slot.name for b in zero.layout.buckets for p in b.pieces(zero.shard_rank)}
        assert shapes == {tuple(dict(net.named_parameters())[n].shape) for n in names}
        return zero.layout.partition
    run_world(3, body)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("reduce_dtype", [None, torch.float32])
def test_bfloat16_model_keeps_float32_masters(stage, reduce_dtype):
    cfg = Config(stage=stage, dtype=torch.bfloat16, options={"reduce_dtype": reduce_dtype})

    def body(rank):
        net, zero = train_zero(rank, cfg)
        with zero.gathered():
            assert all(p.dtype == torch.bfloat16 for p in net.parameters())
        for b, m in enumerate(zero._shards.masters):
            assert m.dtype == torch.float32 and torch.equal(zero._block(b), m.to(torch.bfloat16))
        assert all(v.dtype == torch.float32 for st in zero.state.values() for k, v in st.items() if k != "step")
        assert zero.memory()["master"] == 4 * zero.layout.shard_numel(zero.shard_rank)
        return snapshot(net, zero), None
    results = run_world(3, body)
    assert_identical(results)
    ref = flat_params(train_plain(3, cfg))
    assert max_diff(results[0][0], ref) <= 0.05  # bfloat16 gradients rounded in another order


@pytest.mark.parametrize("stage", [1, 2])
def test_grad_scaler_skips_on_every_rank(stage):
    def body(rank):
        net, out = scaler_run(rank, stage, poisoned_by=1)
        return flat_params(net), out

    results = run_world(3, body)
    assert_identical(results)
    for _, out in results:
        assert [o[0] for o in out] == [False, False, True, False]
        assert [o[1] for o in out] == [1024.0, 1024.0, 512.0, 512.0]


@pytest.mark.parametrize("stage", [1, 2])
def test_grad_scaler_unpoisoned_is_bitwise_unscaled(stage):
    def body(rank):
        net = make_model()
        zero = ZeroOptimizer(torch.optim.Adam, net, stage=stage, options=ZeroOptions(bucket_bytes=256), lr=0.01)
        scaler = GradScaler(init_scale=2.0**10)
        for s in range(4):
            x, y = batch(rank, s)
            scaler.scale(F.mse_loss(net(x), y)).backward()
            scaler.step(zero)
            scaler.update()
            zero.zero_grad()
        return flat_params(net), None
    assert torch.equal(run_world(2, body)[0][0], run_cfg(2, Config(stage=stage))[0][0])


def test_stage2_frees_full_gradients_and_bounds_working_buffers():
    def body(rank):
        net = make_model()
        zero = ZeroOptimizer(torch.optim.Adam, net, stage=2, options=ZeroOptions(bucket_bytes=64, max_inflight=2),
                             lr=0.01)
        x, y = batch(rank, 0)
        F.mse_loss(net(x), y).backward()
        assert all(p.grad is None for p in net.parameters())
        zero.step()
        mem = zero.memory()
        assert len(zero.layout.buckets) >= 5
        assert 0 < mem["buffers"] <= mem["buffers_bound"] and mem["buffers_now"] == 0
        psi = sum(p.numel() for p in net.parameters())
        shard = zero.layout.shard_numel(zero.shard_rank)
        assert mem["parameters"] == 4 * psi and mem["gradients"] == 4 * shard and mem["master"] == 0
        assert 8 * shard <= mem["optimizer"] <= 8 * shard + 4 * len(zero._shards.pieces)
        return mem
    run_world(3, body)


def test_stage1_memory_and_consumed_gradients():
    def body(rank):
        net = make_model()
        zero = ZeroOptimizer(torch.optim.SGD, net, stage=1, lr=0.1, momentum=0.9)
        psi = sum(p.numel() for p in net.parameters())
        x, y = batch(rank, 0)
        F.mse_loss(net(x), y).backward()
        zero.step()
        mem = zero.memory()
        assert mem["parameters"] == 4 * psi and mem["gradients"] == 4 * psi and mem["buffers"] == 0
        assert mem["optimizer"] == 4 * zero.layout.shard_numel(zero.shard_rank)
        largest_piece = max(p.numel for p in zero._shards.pieces)
        assert mem["buffers_bound"] == 4 * net.fc2.weight.numel() + 8 * largest_piece
        F.mse_loss(net(x), y).backward()
        with pytest.raises(RuntimeError, match="zero_grad"):
            zero.step()
        zero.zero_grad()
        F.mse_loss(net(x), y).backward()
        zero.step()
    run_world(2, body)


def test_grads_made_anew_by_autograd_are_used():
    """``model.zero_grad()`` (set to None) instead of ``zero.zero_grad()``: autograd makes new tensors."""
    cfg = Config(stage=1, steps=3)

    def body(rank):
        net = make_model()
        zero = ZeroOptimizer(torch.optim.Adam, net, options=ZeroOptions(bucket_bytes=256), lr=0.01)
        for s in range(3):
            net.zero_grad()
            zero.zero_grad()
            net.zero_grad(set_to_none=True)
            x, y = batch(rank, s)
            F.mse_loss(net(x), y).backward()
            zero.step()
        return flat_params(net), None
    assert max_diff(run_world(2, body)[0][0], flat_params(train_plain(2, cfg))) <= TOL


def test_param_groups_and_lists():
    def body(rank):
        net = make_model()
        groups = [{"params": [net.fc1.weight, net.fc1.bias], "lr": 0.0},
                  {"params": [p for n, p in net.named_parameters() if not n.startswith("fc1")]}]
        before = net.fc1.weight.detach().clone()
        zero = ZeroOptimizer(torch.optim.SGD, groups, stage=2, options=ZeroOptions(bucket_bytes=128), lr=0.1)
        assert [g["lr"] for g in zero.param_groups] == [0.0, 0.1]
        x, y = batch(rank, 0)
        F.mse_loss(net(x), y).backward()
        zero.step()
        assert torch.equal(net.fc1.weight, before) and not torch.equal(net.fc2.weight, make_model().fc2.weight)
        zero.param_groups[0]["lr"] = 0.1
        names = {s.name for b in zero.layout.buckets for s in b.slots}
        assert names == {"0.0", "0.1"} | {f"1.{i}" for i in range(5)}
        return flat_params(net), None
    assert_identical(run_world(3, body))


def test_broadcast_at_construction():
    def body(rank):
        torch.manual_seed(rank)
        net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        net[1].running_mean.fill_(rank)
        ZeroOptimizer(torch.optim.SGD, net, lr=0.1)
        return flat_params(net), net[1].running_mean.clone()
    out = run_world(3, body)
    assert all(torch.equal(o[0], out[0][0]) and torch.equal(o[1], torch.zeros(4)) for o in out)


def test_explicit_even_partition_with_another_class():
    def body(rank):
        net = make_model()
        zero = ZeroOptimizer(NormSGD, net, options=ZeroOptions(partition=Even(), bucket_bytes=64), lr=0.1)
        assert isinstance(zero.layout.partition, Even)
        assert any(p.start > 0 or p.end < p.slot.numel for p in zero._shards.pieces)
    run_world(2, body)


def test_custom_reducer_carries_every_bucket():
    from ringlet.torch.comm import Comm
    from ringlet.torch.training.zero.reduce import Reducer

    class Counting(Reducer):
        def __init__(self, comm):
            super().__init__(comm)
            self.calls = []

        def reduce_scatter_(self, flat, counts, name, state=None, *, check=False):
            assert isinstance(state, dict)
            self.calls.append(("rs", flat.numel()))
            return super().reduce_scatter_(flat, counts, name, state, check=True)

        def allgather_(self, flat, counts, name, *, check=False):
            self.calls.append(("ag", flat.numel()))
            return super().allgather_(flat, counts, name, check=True)

    def body(rank):
        red = Counting(Comm())
        net, zero = train_zero(rank, Config(stage=2, steps=2, options={"reducer": red}))
        n = len(zero.layout.buckets)
        assert zero.reducer is red and len(red.calls) == 4 * n
        assert sorted(red.calls[:n]) == sorted(("rs", b.numel) for b in zero.layout.buckets)
        return flat_params(net), None
    results = run_world(3, body)
    assert max_diff(results[0][0], flat_params(train_plain(3, Config(stage=2, steps=2)))) <= TOL


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("opt", ["adam", "sgd"])
@pytest.mark.parametrize("micro", [1, 2])
def test_stage3_equals_plain_training(world, opt, micro):
    cfg = Config(stage=3, opt=opt, micro=micro)

    def body(rank):
        net, zero = train_zero(rank, cfg)
        mem = zero.memory()
        shard = zero.layout.shard_numel(zero.shard_rank)
        assert mem["parameters"] == 4 * shard and mem["gradients"] == 4 * shard and mem["master"] == 0
        with zero.gathered():
            return flat_params(net), mem
    results = run_world(world, body)
    assert_identical(results)
    assert max_diff(results[0][0], flat_params(train_plain(world, cfg))) <= TOL


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("kind", ["hierarchical", "fp16"])
def test_other_reducers(stage, kind):
    """The hierarchical and compressed reducers plug in through ZeroOptions.reducer."""
    from ringlet.torch.training.zero import reduce_compressed as comp
    from ringlet.torch.training.zero import reduce_hierarchical as hier
    from ringlet.torch.comm import Comm

    def body(rank):
        red = hier.HierarchicalReducer(host_of=(0, 0, 1, 1)) if kind == "hierarchical" else \
            comp.CompressedReducer(Comm(), "fp16")
        net, zero = train_zero(rank, Config(stage=stage, clip=0.5, options={"reducer": red}))
        assert zero.world == (2 if kind == "hierarchical" else 4)
        return snapshot(net, zero), None
    results = run_world(4, body)
    assert_identical(results)
    tol = TOL if kind == "hierarchical" else 1e-3
    assert max_diff(results[0][0], flat_params(train_plain(4, Config(stage=stage, clip=0.5)))) <= tol


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_is_the_whole_models(stage, norm_type):
    world = 3
    plain = make_model()
    xs, ys = zip(*(batch(r, 0) for r in range(world)))
    F.mse_loss(plain(torch.cat(xs)), torch.cat(ys)).backward()
    ref = torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.1, norm_type=norm_type)

    def body(rank):
        net = make_model()
        zero = ZeroOptimizer(torch.optim.SGD, net, stage=stage, options=ZeroOptions(bucket_bytes=128), lr=1.0)
        x, y = batch(rank, 0)
        F.mse_loss(net(x), y).backward()
        total = zero.clip_grad_norm_(0.1, norm_type=norm_type)
        zero.step()
        return snapshot(net, zero), float(total)
    out = run_world(world, body)
    assert all(o[1] == out[0][1] for o in out) and abs(out[0][1] - float(ref)) <= 1e-5 * float(ref)
    with torch.no_grad():
        for p in plain.parameters():
            p.sub_(p.grad)
    assert max_diff(out[0][0], flat_params(plain)) <= TOL
    with pytest.raises(ValueError, match="norm_type"):
        run_world(1, lambda r: ZeroOptimizer(torch.optim.SGD, make_model(), lr=1.0).clip_grad_norm_(1.0, 0))
