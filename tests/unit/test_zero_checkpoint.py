"""ZeRO checkpoints with the reference sharder (ranks as threads): round trips in the same and other world
sizes, consolidation against the unsharded model and optimizer, bitwise."""
import pytest
import torch
from zero_ckpt_models import Net, assert_shards_equal, assert_state_dicts_equal, make, sharded
from zero_fake import RefZero

from ringlet.torch.training.zero import checkpoint as zckpt

from conftest import run_world


def save_world(p: int, path, opt: str = "adam", steps: int = 3, stage: int = 1, **net_kw):
    def body(rank):
        net, zero = sharded(p, rank, opt=opt, steps=steps, stage=stage, **net_kw)
        handle = zckpt.save(path, zero, net, extra={"step": steps, "note": "x"})
        assert handle.done() and handle.bytes_written > 0 and handle.stall_seconds >= handle.snapshot_seconds > 0
        return zero.shard_state()
    return run_world(p, body)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_round_trip_same_world(p, opt, tmp_path):
    saved = save_world(p, tmp_path / "ck", opt)

    def body(rank):
        net, zero = sharded(p, rank, seed=1, opt=opt, steps=0)  # other values, no optimizer state yet
        zero.param_groups[0]["lr"] = 123.0
        extra = zckpt.load(tmp_path / "ck", zero, net)
        assert extra == {"step": 3, "note": "x"}
        assert_shards_equal(zero.shard_state(), saved[rank])
        ref, _ = make(opt=opt)
        assert_state_dicts_equal(net.state_dict(), ref.state_dict())
        return zero.param_groups[0]["lr"]

    assert run_world(p, body) == [0.1 if opt == "sgd" else 1e-2] * p


@pytest.mark.parametrize("p,q", [(4, 2), (2, 3), (3, 1), (1, 4), (3, 4)])
def test_load_into_another_world_size_and_continue(p, q, tmp_path):
    save_world(p, tmp_path / "ck", stage=2)

    def body(rank):
        net, zero = sharded(q, rank, seed=5, steps=0, stage=1)
        assert zckpt.load(tmp_path / "ck", zero, net)["step"] == 3
        _, expected = sharded(q, rank)  # the same trained state, sharded for q ranks directly
        assert_shards_equal(zero.shard_state(), expected.shard_state())
        for step in range(3, 6):
            zero.step(step)
            expected.step(step)
        assert_shards_equal(zero.shard_state(), expected.shard_state())
        return {k: v.clone() for k, v in net.state_dict().items()}

    results = run_world(q, body)
    for sd in results[1:]:
        assert_state_dicts_equal(sd, results[0])


@pytest.mark.parametrize("p", [1, 3, 4])
@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_consolidate_equals_unsharded(p, opt, tmp_path):
    save_world(p, tmp_path / "ck", opt)
    full = zckpt.consolidate(tmp_path / "ck")
    net, optimizer = make(opt=opt)
    assert_state_dicts_equal(full["model"], net.state_dict())
    assert full["extra"] == {"step": 3, "note": "x"} and full["meta"]["world"] == p
    names = {id(q): n for n, q in net.named_parameters()}
    for group, saved in zip(optimizer.param_groups, full["optimizer"]["param_groups"]):
        assert sorted(saved["params"]) == sorted(names[id(q)] for q in group["params"] if q.numel() > 0)
        assert {k: v for k, v in saved.items() if k != "params"} == {k: v for k, v in group.items() if k != "params"}
    for q, state in optimizer.state.items():
        if q.numel() == 0:  # an element-less parameter is in no piece: no state is saved for it
            assert names[id(q)] not in full["optimizer"]["state"]
            continue
        mine = full["optimizer"]["state"][names[id(q)]]
        assert mine.keys() == state.keys()
        for k in state:
            assert torch.equal(torch.as_tensor(mine[k]), torch.as_tensor(state[k])), (names[id(q)], k)

    fresh, _ = make(seed=9, opt=opt, steps=0)
    cls = type(optimizer)
    other = cls([{"params": ps, "lr": 0.5} for ps in fresh.groups()])
    zckpt.load_into_torch_optimizer(full, other, fresh)
    fresh.load_state_dict(full["model"])
    a, b = other.state_dict(), optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i in b["state"]:
        if a["state"].get(i) is None:
            assert i == 4  # "e", without elements
            continue
        for k in b["state"][i]:
            assert torch.equal(a["state"][i][k], b["state"][i][k])


def test_consolidate_model_dtype_and_no_module(tmp_path):
    def body(rank):
        net, zero = sharded(2, rank, steps=0, dtype=torch.bfloat16)
        zckpt.save(tmp_path / "with", zero, net)
        zckpt.save(tmp_path / "without", zero)
    run_world(2, body)
    net = Net(dtype=torch.bfloat16)
    full = zckpt.consolidate(tmp_path / "with")
    assert_state_dicts_equal(full["model"], net.state_dict())
    assert full["master"]["b"].dtype == torch.float32 and full["optimizer"]["state"] == {}
    bare = zckpt.consolidate(tmp_path / "without")["model"]
    trainable = {n: q for n, q in net.named_parameters() if q.requires_grad and q.numel() > 0}
    assert sorted(bare) == sorted(trainable)  # an element-less parameter is in no piece without the module
    for n, q in trainable.items():
        assert bare[n].dtype == torch.bfloat16 and torch.equal(bare[n], q.detach())


def needed(q: int, rank: int, p: int) -> set[int]:
    """The ranks of ``p`` whose pieces overlap those of rank ``rank`` of ``q``."""
    mine = sharded(q, rank)[1].pieces
    out = set()
    for s in range(p):
        for a in sharded(p, s)[1].pieces:
            if any(b.slot.name == a.slot.name and b.start < a.end and a.start < b.end for b in mine):
                out.add(s)
    return out


@pytest.mark.parametrize("q,rank", [(4, 0), (4, 3), (2, 0), (2, 1), (3, 1)])
def test_a_rank_reads_only_the_files_it_needs(q, rank, tmp_path, monkeypatch):
    save_world(4, tmp_path / "ck")
    files = needed(q, rank, 4)
    assert len(files) < 4 and (q != 4 or files == {rank})
    opened = []
    real = torch.load

    def spy(f, *a, **kw):
        opened.append(str(f).rsplit("/", 1)[-1])
        return real(f, *a, **kw)

    monkeypatch.setattr(torch, "load", spy)
    net, zero = sharded(q, rank, seed=2, steps=0)
    zero.world = 1  # one rank of a q-rank layout alone: no refresh collective
    zero.refresh = lambda: None
    zckpt.load(tmp_path / "ck", zero, net)
    data = [n for n in opened if n.startswith("rank-")]
    assert len(data) == len(set(data)) and {int(n[5:10]) for n in data} == files, opened
    _, expected = sharded(q, rank)
    assert_shards_equal(zero.shard_state(), expected.shard_state())


def test_save_over_an_existing_checkpoint_replaces_it(tmp_path):
    save_world(3, tmp_path / "ck", opt="sgd")
    save_world(2, tmp_path / "ck", opt="adam")
    files = sorted(f.name for f in (tmp_path / "ck").iterdir())
    assert len([f for f in files if f.startswith("common-")]) == 1
    assert len([f for f in files if f.startswith("rank-00000-")]) == 1
    full = zckpt.consolidate(tmp_path / "ck")
    assert full["meta"]["world"] == 2 and "exp_avg" in full["optimizer"]["state"]["b"]


def test_latest_picks_the_newest_complete(tmp_path):
    assert zckpt.latest(tmp_path / "none") is None and zckpt.latest(tmp_path) is None
    save_world(2, tmp_path / "step-1")
    save_world(2, tmp_path / "step-2")
    assert zckpt.latest(tmp_path) == tmp_path / "step-2"
    (tmp_path / "step-2" / "rank-00001.json").unlink()
    (tmp_path / "junk").mkdir()
    assert zckpt.latest(tmp_path) == tmp_path / "step-1"
    assert zckpt.is_complete(tmp_path / "step-1") and not zckpt.is_complete(tmp_path / "step-2")


def test_rank_with_no_pieces(tmp_path):
    """More ranks than the smallest bucket has elements: some shards are empty."""
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.arange(3.0))

    def body(rank):
        net = Tiny()
        zero = RefZero(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), 5, rank)
        zero.step(0)
        zckpt.save(tmp_path / "ck", zero, net)
        return [p.numel for p in zero.shard_state().pieces]

    assert sum(map(sum, run_world(5, body))) == 3
    full = zckpt.consolidate(tmp_path / "ck")
    assert full["model"]["w"].shape == (3,) and full["optimizer"]["state"]["w"]["momentum_buffer"].shape == (3,)
