"""ZeRO stage 3 in-process (ranks as threads): equivalence with the plain model, released buffers and the
bound, prefetch order, gathered(), close(). The cases live in test_zero_stage3_cases.py."""
import pytest
import torch

from ringlet.torch.comm import Comm
from ringlet.torch.training.zero import Layout
from ringlet.torch.training.zero.reduce import Reducer
from ringlet.torch.training.zero.stage3 import ShardedParameters, units_of
from ringlet.torch.training.zero.stage3_unit import FREE

from conftest import run_world
from test_zero_stage3_cases import MODELS, batch, build, case_equivalence, make_model


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_equivalence(name, world):
    fails = run_world(world, lambda rank: case_equivalence(rank, world, name, prefetch=True))
    assert fails == [[]] * world


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", ["mlp", "tied", "twice"])
def test_equivalence_without_prefetch_and_with_accumulation(name, world):
    fails = run_world(world, lambda rank: case_equivalence(rank, world, name, prefetch=False, accumulate=2))
    assert fails == [[]] * world


@pytest.mark.parametrize("world", [5, 7])
def test_units_smaller_than_the_world(world):
    fails = run_world(world, lambda rank: case_equivalence(rank, world, "tiny", prefetch=True, accumulate=2))
    assert fails == [[]] * world


@pytest.mark.parametrize("world", [2, 3])
def test_units_split_by_param_group(world):
    """Weights and biases in two param groups: every module needs two buckets."""
    fails = run_world(world, lambda rank: case_equivalence(rank, world, "nested", prefetch=True, by_group=True))
    assert fails == [[]] * world


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_on_gradient_gets_a_fresh_flat_gradient(dtype):
    """on_gradient's tensor: 1-D, the whole bucket in slot order, model dtype, contiguous, not aliasing
    anything the stage keeps; bitwise the plain model's local gradients (zeros where none)."""

    def body(rank):
        model, ref = make_model("unused").to(dtype), make_model("unused").to(dtype)
        named = list(model.named_parameters())
        red = Reducer(Comm())
        layout = Layout.units(named, [0] * len(named), red.shard_size, units_of(model, named))
        got = {}

        def keep(b, g):
            live = {u.buf.data_ptr() for u in sp.units if u.state != FREE and u.numel}
            assert g.untyped_storage().data_ptr() not in live and sp.units[b].flat.grad is None
            got[b] = g

        sp = ShardedParameters(model, named, layout, red, keep)
        x = batch("unused", rank, 0).to(dtype)
        model(x).sum().backward()
        ref(x).sum().backward()
        grads = dict(ref.named_parameters())
        for bucket in layout.buckets:
            want = torch.cat([_local(grads[s.name]).reshape(-1) for s in bucket.slots])
            g = got.get(bucket.index)
            if g is None:
                assert not want.any() and bucket.slots[0].name.startswith("1.")  # the module that ignores w
                continue
            assert g.dtype == dtype and g.dim() == 1 and g.is_contiguous() and torch.equal(g, want), bucket.index
        return sorted(got)

    assert run_world(2, body) == [[0, 2, 3, 4]] * 2


def _local(p):
    return p.grad if p.grad is not None else torch.zeros_like(p)


class Recording(Reducer):
    """A reducer that logs the names of its all-gathers (and whether they were checked)."""

    def __init__(self, comm):
        super().__init__(comm)
        self.log: list[tuple[str, bool]] = []

    def allgather_(self, flat, counts, name, *, check=False):
        self.log.append((name, check))
        return super().allgather_(flat, counts, name, check=check)


def _states(sp):
    return [u.state != FREE for u in sp.units]


def _held(sp):
    """Bytes of full buffers allocated now, counted from the storages themselves."""
    return sum(u.flat.untyped_storage().nbytes() for u in sp.units)


@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetch_order_and_identical_results(prefetch):
    """First forward: gathers on demand, checked, then a checked marker. Later: the next unit is in
    flight while one computes (prefetch) or not gathered (no prefetch), forward in order, backward in
    reverse; blocks identical with and without prefetch."""

    def body(rank):
        model, sp, blocks, layout = build("mlp", prefetch, reducer=Recording(Comm()))
        log = sp.reducer.log
        linears = [m for m in model if isinstance(m, torch.nn.Linear)]
        seen, held = [], []
        for k, m in enumerate(linears):
            m.register_forward_pre_hook(lambda mod, args, k=k: seen.append((k, _states(sp))))
            m.register_forward_pre_hook(lambda mod, args: held.append(_held(sp)))
        handed, orig = [], sp.on_gradient
        sp.on_gradient = lambda b, g: (handed.append((b, _states(sp))), held.append(_held(sp)), orig(b, g))
        out = []
        for step in range(3):
            seen.clear()
            handed.clear()
            del log[:]
            model(batch("mlp", rank, step)).sum().backward()
            out.append([b.clone() for b in blocks.blocks])
            names = [n.split(":")[1] for n, _ in log if ":" in n and "first" not in n]
            # the first layer's backward does not read its weight (its input needs no gradient): only the
            # prefetch gathers it
            assert names == ["0", "2", "3", "3", "2"] + (["0"] if prefetch else []), names
            if step == 0:
                assert [n for n, c in log if c] == ["zero3/first forward"] * 4
                assert [n for n, c in log if not c][:3] == [n for n, _ in log if ":" in n][:3]
                assert [s[k] for k, s in seen] == [True] * 3
            else:
                assert not any(c for _, c in log)
                nxt = [s[k + 1] for k, s in seen[:-1]]
                assert nxt == [prefetch] * 2, seen
            # backward: when unit k's gradient is handed (and k freed), unit k-1 is in flight already
            assert [b for b, _ in handed] == [2, 1, 0]
            assert [s[b - 1] for b, s in handed[:2]] == [prefetch] * 2, handed
            biggest = max(u.nbytes for u in sp.units)
            assert sp.memory()["peak_gathered"] <= (2 if prefetch else 1) * biggest
            assert max(held) <= (2 if prefetch else 1) * biggest and _held(sp) == 0, held
            held.clear()
        return out

    assert [len(r) for r in run_world(2, body)] == [3, 3]


def test_prefetch_gives_identical_blocks():
    def body(rank):
        out = []
        for prefetch in (True, False):
            model, sp, blocks, _ = build("twice", prefetch)
            for step in range(3):
                model(batch("twice", rank, step)).sum().backward()
            out.append(blocks.blocks)
        return all(torch.equal(a, b) for a, b in zip(*out))

    assert run_world(3, body) == [True] * 3


def test_gathered_shows_full_parameters_and_writes_back():
    def body(rank):
        model, sp, _, _ = build("mlp")
        ref = make_model("mlp")
        with sp.gathered() as m:
            assert m is model
            for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
                assert isinstance(p, torch.nn.Parameter) and torch.equal(p, q), n
            sd = model.state_dict()
        assert all(torch.equal(sd[k], v) for k, v in ref.state_dict().items())  # still valid outside
        with sp.gathered():
            with torch.no_grad():
                model[0].weight.add_(1)  # dropped: no writeback
        x = batch("mlp", rank, 0)
        assert torch.equal(model(x), ref(x))
        with sp.gathered(writeback=True):
            with torch.no_grad():
                model[0].weight.add_(1)
            model[2].bias.data = torch.full_like(model[2].bias, 0.5)  # replaced, not written in place
        with torch.no_grad():
            ref[0].weight.add_(1)
            ref[2].bias.fill_(0.5)
        assert torch.equal(model(x), ref(x))
        with sp.gathered(writeback=True):
            model.load_state_dict(make_model("mlp", seed=7).state_dict())
        assert torch.equal(model(x), make_model("mlp", seed=7)(x))
        assert sp.memory()["gathered"] == 0 and all(u.flat.untyped_storage().nbytes() == 0 for u in sp.units)
        return True

    assert run_world(3, body) == [True] * 3


def test_gathered_eval_forward_and_refusals():
    def body(rank):
        model, sp, blocks, _ = build("nested")
        ref = make_model("nested")
        x = batch("nested", rank, 0)
        with sp.gathered():
            with torch.no_grad():
                assert torch.equal(model(x), ref(x))
            with pytest.raises(RuntimeError, match="inside gathered"):
                with sp.gathered():
                    pass
        model[0].register_forward_hook(lambda *a: sp.gathered().__enter__())
        with pytest.raises(RuntimeError, match="inside a forward"):
            model(x)
        return blocks.calls

    assert run_world(2, body) == [[], []]


def test_close_gives_the_parameters_back():
    def body(rank):
        model, sp, _, _ = build("tied", reducer=Recording(Comm()))
        ref = make_model("tied")
        x = batch("tied", rank, 0)
        model(x).sum().backward()
        sp.close()
        sp.close()
        n = len(sp.reducer.log)
        assert model.head.weight is model.emb.weight and isinstance(model.emb.weight, torch.nn.Parameter)
        assert torch.equal(model(x), ref(x)) and len(sp.reducer.log) == n
        for (_, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            assert torch.equal(p, q)
        with pytest.raises(RuntimeError, match="closed"):
            sp.shard(0)
        with pytest.raises(RuntimeError, match="closed"):
            sp.gathered().__enter__()
        return True

    assert run_world(2, body) == [True] * 2


def test_shard_is_the_optimizers_to_write():
    """Values written into shard(b) are what the next forward gathers."""

    def body(rank):
        model, sp, _, layout = build("mlp")
        ref = make_model("mlp")
        with torch.no_grad():
            for p in ref.parameters():
                p.mul_(2)
        for b in range(len(layout.buckets)):
            sp.shard(b).mul_(2)
        x = batch("mlp", rank, 0)
        return torch.equal(model(x), ref(x))

    assert run_world(4, body) == [True] * 4


def test_eval_forward_with_grad_and_no_backward():
    """A forward whose graph is dropped, then training goes on."""

    def body(rank):
        model, sp, blocks, _ = build("mlp")
        model.eval()
        model(batch("mlp", rank, 5))
        model.train()
        model(batch("mlp", rank, 0)).sum().backward()
        return sorted(blocks.calls), sp.memory()["gathered"]

    assert run_world(2, body) == [([0, 1, 2], 0)] * 2


def test_failed_forward_then_training_and_retain_graph():
    """A forward that raises (bad input) leaves nothing gathered and the next one is the checked first
    forward; a backward run twice over a retained graph hands every gradient twice."""

    def body(rank):
        model, sp, blocks, layout = build("mlp")
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            model(torch.ones(2, 4))
        assert sp.memory()["gathered"] == 0 and not sp._recorded
        loss = model(batch("mlp", rank, 0)).sum()
        loss.backward(retain_graph=True)
        first = [b.clone() for b in blocks.blocks]
        loss.backward()
        assert sorted(blocks.calls) == [0, 0, 1, 1, 2, 2] and sp.memory()["gathered"] == 0
        return all(torch.equal(b, 2 * f) for b, f in zip(blocks.blocks, first))

    assert run_world(3, body) == [True] * 3
