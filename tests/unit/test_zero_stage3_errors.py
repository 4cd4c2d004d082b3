"""ZeRO stage 3's errors: a sharded parameter touched outside forward/backward, forwards that differ
across ranks, bad layouts and arguments; and units_of's rule."""
import pytest
import torch
import torch.nn as nn

from ringlet.torch.comm import Comm
from ringlet.torch.training.zero import Layout
from ringlet.torch.training.zero.placeholder import ShardedParameterError, ShardedPlaceholder
from ringlet.torch.training.zero.reduce import Reducer
from ringlet.torch.training.zero.stage3 import ShardedParameters, units_of
from ringlet.types import MismatchError

from conftest import run_world
from test_zero_stage3_cases import Tied, batch, build, make_model

MESSAGE = (r"0\.weight is sharded by ZeRO stage 3 \(this rank holds {held} of 35 elements\): it has no values "
           r"outside the forward and backward of the module that owns it\. Read it inside `with zero\.gathered\(\):`")


def test_outside_access_says_how_to_gather():
    def body(rank):
        model, sp, _, layout = build("mlp")
        held = sum(p.numel for p in layout.buckets[0].pieces(rank) if p.slot.name == "0.weight")
        w = model[0].weight
        assert isinstance(w, ShardedPlaceholder) and w.shape == (7, 5) and w.grad is None
        for touch in (lambda: w.sum(), lambda: print(w), lambda: w + 1, lambda: w.data, lambda: model.state_dict(),
                      lambda: w.detach(), lambda: torch.save(w, "/dev/null"), lambda: model.to(torch.float64)):
            with pytest.raises(ShardedParameterError, match=MESSAGE.format(held=held)):
                touch()
        model.zero_grad()  # metadata only: allowed
        print(model)
        assert [n for n, p in model.named_parameters() if p.requires_grad] == ["0.weight", "0.bias", "2.weight",
                                                                                "2.bias", "3.weight", "3.bias"]
        model(batch("mlp", rank, 0)).sum().backward()  # no error inside forward and backward
        with sp.gathered():
            float(model[0].weight.detach().sum())
        return held

    helds = run_world(4, body)
    assert sum(helds) == 35


class RankOrder(nn.Module):
    """Runs its layers in an order that depends on the rank (and, with ``extra``, one more on rank 1)."""

    def __init__(self, rank: int, extra: bool):
        super().__init__()
        self.rank, self.extra = rank, extra
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.c = nn.Linear(3, 3)

    def forward(self, x):
        if self.extra:
            x = self.b(self.a(x))
            return self.c(x) if self.rank == 1 else x
        return self.b(self.a(x)) if self.rank == 0 else self.a(self.b(x))


@pytest.mark.parametrize("extra", [False, True])
def test_forwards_that_differ_across_ranks_give_a_mismatch(extra):
    def body(rank):
        torch.manual_seed(0)
        model = RankOrder(rank, extra)
        named = list(model.named_parameters())
        red = Reducer(Comm())
        layout = Layout.units(named, [0] * len(named), red.shard_size, units_of(model, named))
        ShardedParameters(model, named, layout, red, lambda b, g: None)
        with pytest.raises(MismatchError) as err:
            model(torch.ones(2, 3))
        return str(err.value)

    msgs = run_world(2, body)
    want = ("at gather 2 of the first forward rank 0 ended its forward but rank 1 gathers unit 2 (c)" if extra
            else "at gather 0 of the first forward rank 0 gathers unit 0 (a) but rank 1 gathers unit 1 (b)")
    assert msgs[0] == msgs[1] and want in msgs[0], msgs


def test_units_of_rule():
    model = Tied()
    named = list(model.named_parameters())
    assert [n for n, _ in named] == ["emb.weight", "mid.weight", "mid.bias", "head.bias"]
    assert units_of(model, named) == [[0], [1, 2], [3]]
    assert units_of(model, named, groups=[0, 0, 1, 0]) == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="listed twice"):
        units_of(model, named + [("again", model.mid.bias)])
    with pytest.raises(ValueError, match="not parameters of the module"):
        units_of(model, named + [("stray", nn.Parameter(torch.ones(2)))])
    frozen = make_model("mlp")
    frozen[2].weight.requires_grad_(False)
    trainable = [(n, p) for n, p in frozen.named_parameters() if p.requires_grad]
    assert units_of(frozen, trainable) == [[0, 1], [2], [3, 4]]


def test_frozen_parameters_stay_in_place():
    def body(rank):
        model, ref = make_model("mlp"), make_model("mlp")
        model[2].weight.requires_grad_(False)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        red = Reducer(Comm())
        layout = Layout.units(named, [0] * len(named), red.shard_size, units_of(model, named))
        ShardedParameters(model, named, layout, red, lambda b, g: None)
        assert isinstance(model[2].weight, nn.Parameter) and torch.equal(model[2].weight, ref[2].weight)
        x = batch("mlp", rank, 0)
        return torch.equal(model(x), ref(x))

    assert run_world(2, body) == [True, True]


def test_bad_layouts():
    def body(rank):
        model = make_model("mlp")
        named = list(model.named_parameters())
        red = Reducer(Comm())
        units = units_of(model, named)
        with pytest.raises(ValueError, match="layout is for 3 ranks"):
            ShardedParameters(model, named, Layout.units(named, [0] * 6, 3, units), red, None)
        short = Layout.units(named[:4], [0] * 4, red.shard_size, [[0, 1], [2, 3]])
        with pytest.raises(ValueError, match="holds 4 of the 6"):
            ShardedParameters(model, named, short, red, None)
        other = make_model("mlp")
        with pytest.raises(ValueError, match="not parameters of the module"):
            ShardedParameters(other, named, Layout.units(named, [0] * 6, red.shard_size, units), red, None)
        assert isinstance(model[0].weight, nn.Parameter)  # nothing was sharded
        return True

    assert run_world(2, body) == [True, True]
