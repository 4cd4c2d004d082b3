"""LocalSGD and DiLoCo in-process (ranks as threads, plain modules): argument checks, the schedule, and
the two equivalences with parameter averaging after every step. The DDP side and real transports are in
tests/multiproc/test_local_sgd.py."""
from __future__ import annotations

import threading

import pytest
import torch
from conftest import run_world

import ringlet
from ringlet.torch.training import DiLoCo, LocalSGD, MasterWeights


_SEED_LOCK = threading.Lock()  # ranks are threads sharing torch's global generator


def net() -> torch.nn.Module:
    with _SEED_LOCK:
        torch.manual_seed(11)
        return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(),
                                   torch.nn.Linear(6, 2))


def local_step(model, opt, rank: int, step: int) -> None:
    g = torch.Generator().manual_seed(100 * step + rank)
    opt.zero_grad()
    model(torch.randn(5, 4, generator=g)).square().mean().backward()
    opt.step()


def flat_state(model) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in list(model.parameters()) + list(model.buffers())])


def averaged_reference(rank: int, steps: int) -> torch.Tensor:
    """Every step local, then every parameter and floating buffer averaged with ringlet.allreduce."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        local_step(model, opt, rank, step)
        with torch.no_grad():
            for t in list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]:
                t.copy_(ringlet.allreduce(t, op="avg"))
    return flat_state(model)


def identical_everywhere(state: torch.Tensor) -> bool:
    rows = ringlet.allgather(state.unsqueeze(0))
    return all(torch.equal(rows[0], r) for r in rows)


@pytest.mark.parametrize("kind", ["local_sgd", "diloco"])
@pytest.mark.parametrize("p", [2, 3])
def test_every_step_equals_parameter_averaging(kind, p):
    def fn(rank):
        model = net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        strategy = (LocalSGD(model, opt, period=1) if kind == "local_sgd"
                    else DiLoCo(model, opt, period=1, outer_lr=1.0, outer_momentum=0.0))
        same = []
        for step in range(4):
            g = torch.Generator().manual_seed(100 * step + rank)
            opt.zero_grad()
            model(torch.randn(5, 4, generator=g)).square().mean().backward()
            strategy.step()
            same.append(identical_everywhere(flat_state(model)))
        ref = averaged_reference(rank, 4)
        return same, float((flat_state(model) - ref).abs().max())

    for same, diff in run_world(p, fn):
        assert all(same)
        assert diff <= 1e-6


@pytest.mark.parametrize("kind", ["local_sgd", "diloco"])
def test_with_master_weights_the_masters_are_averaged(kind):
    """A bfloat16 model with float32 masters: the masters are what is averaged (averaging the model alone
    would be undone by the next step), and the model holds their rounded copies."""
    def fn(rank):
        model = net().to(torch.bfloat16)
        if rank == 1:  # different start on purpose: the strategy's broadcast must reach the masters
            with torch.no_grad():
                for q in model.parameters():
                    q.add_(1.0)
        opt = MasterWeights(torch.optim.SGD(model.parameters(), lr=0.1))
        strategy = (LocalSGD(model, opt, period=1) if kind == "local_sgd"
                    else DiLoCo(model, opt, period=1, outer_lr=1.0, outer_momentum=0.0))
        masters = [m for _, m in opt.pairs]
        same = [identical_everywhere(flat_state(model)) and identical_everywhere(torch.cat([m.reshape(-1)
                                                                                           for m in masters]))]
        for step in range(3):
            g = torch.Generator().manual_seed(100 * step + rank)
            opt.zero_grad()
            model(torch.randn(5, 4, generator=g).to(torch.bfloat16)).float().square().mean().backward()
            before = torch.cat([m.detach().reshape(-1).clone() for m in masters])
            opt.step()
            local = torch.cat([m.detach().reshape(-1).clone() for m in masters])
            strategy.after_step()
            after = torch.cat([m.detach().reshape(-1) for m in masters])
            mean = ringlet.allreduce(local, op="avg")
            same.append(identical_everywhere(after) and float((after - mean).abs().max()) <= 1e-6
                        and not torch.equal(before, after)
                        and all(torch.equal(p, m.to(torch.bfloat16)) for p, m in opt.pairs))
        return same

    for same in run_world(2, fn):
        assert all(same), same


def test_the_schedule():
    def fn(rank):
        model = net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        local = LocalSGD(model, opt, period=3)
        diloco = DiLoCo(net(), torch.optim.SGD(model.parameters(), lr=0.1), period=2)
        return [local.after_step() for _ in range(7)], [diloco.after_step() for _ in range(5)], local.averagings

    for local, outer, n in run_world(2, fn):
        assert local == [False, False, True, False, False, True, False] and n == 2
        assert outer == [False, True, False, True, False]


def test_bad_arguments():
    def fn(rank):
        model = net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ValueError, match="period"):
                LocalSGD(model, opt, period=bad)
            with pytest.raises(ValueError, match="period"):
                DiLoCo(model, opt, period=bad)
        with pytest.raises(ValueError, match="warmup_steps"):
            LocalSGD(model, opt, period=2, warmup_steps=-1)
        with pytest.raises(ValueError, match="DistributedDataParallel"):
            LocalSGD(model, opt, period=2, warmup_steps=3)  # a warm-up needs DDP to average gradients
        with pytest.raises(ValueError, match="outer_lr"):
            DiLoCo(model, opt, period=2, outer_lr=0)
        with pytest.raises(ValueError, match="outer_momentum"):
            DiLoCo(model, opt, period=2, outer_momentum=1.0)
        with pytest.raises(ValueError, match="compressor .zip."):
            DiLoCo(model, opt, period=2, compression="zip")
        with pytest.raises(TypeError):
            LocalSGD(object(), opt, period=2)
        DiLoCo(model, opt, period=2, compression="none")  # lossless: plain float32 deltas
        return True

    assert run_world(1, fn) == [True]


@pytest.mark.parametrize("compression", ["fp16", "int8+ef"])
def test_compressed_deltas_keep_ranks_identical(compression):
    """The deltas travel compressed: every rank still ends each outer step with the same model, within the
    compressor's error of the float32 outer step."""
    def fn(rank):
        out = []
        for spec in (None, compression):
            model = net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            outer = DiLoCo(model, opt, period=2, outer_lr=1.0, outer_momentum=0.0, compression=spec)
            for step in range(4):
                opt.zero_grad()
                g = torch.Generator().manual_seed(100 * step + rank)
                model(torch.randn(5, 4, generator=g)).square().mean().backward()
                outer.step()
            out.append(flat_state(model))
        return identical_everywhere(out[1]), (out[1] - out[0]).abs().max().item()

    for same, err in run_world(3, fn):
        assert same and err < 2e-2
