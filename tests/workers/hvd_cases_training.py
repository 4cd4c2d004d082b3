"""Training cases of the Horovod-API job (see ``hvd_training_worker.py``): ``DistributedOptimizer`` against
single-process training on the concatenated batch.

Each rank trains a copy of the model on its slice of a global batch (every rank generates the global
batch from a seed), and also trains a reference copy on the whole batch in one process; after a few
steps the parameters must agree to 1e-6 (fp32). The configurations cover accumulation
(``backward_passes_per_step``), grouped reductions, ``op=Sum``, the predivide factor, parameters that
some or all ranks leave unused, sparse gradients and the explicit synchronize()/skip_synchronize()
pattern; fusion on/off is the worker's two sessions.
"""
from __future__ import annotations

import copy
import warnings
import zlib

import torch
import torch.nn.functional as F
from torch import nn

import ringlet.torch as hvd

STEPS = 4
MICRO = 4  # rows per rank per backward pass
TOL = 1e-6
CASES: list = []


def case(fn):
    CASES.append((fn.__name__, fn))
    return fn


def quarters(key: str, shape) -> torch.Tensor:
    """Multiples of 1/4 in [-1, 1]: exact in fp32, small enough that training stays tame."""
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    return torch.randint(-4, 5, shape, generator=g).float() / 4


class Net(nn.Module):
    def __init__(self, aux: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)
        self.aux = nn.Linear(6, 3) if aux else None

    def forward(self, x, use_aux: bool = False):
        y = self.fc2(torch.tanh(self.fc1(x)))
        if use_aux:
            y = y + self.aux(x)
        return y


def seeded(model: nn.Module, seed: int) -> nn.Module:
    """Overwrite the parameters from a private generator (the global RNG is shared by threads when the
    cases run in-process)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def fresh(aux: bool = False) -> Net:
    return seeded(Net(aux), 1234)


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def assert_trained_equal(model: nn.Module, ref: nn.Module, start: nn.Module, tol: float = TOL) -> None:
    d = max_diff(model, ref)
    if not d <= tol:
        raise AssertionError(f"parameters differ from single-process training by {d:.3g} (> {tol})")
    if max_diff(ref, start) < 1e-3:
        raise AssertionError("training did not move the parameters: the comparison would prove nothing")


def run_equivalence(bpps: int = 1, op=None, predivide: float = 1.0, groups=None, compression=None,
                    momentum: float = 0.9, tol: float = TOL, explicit_sync: bool = False) -> None:
    n, r = hvd.size(), hvd.rank()
    op = hvd.Average if op is None else op
    model = fresh()
    ref, start = copy.deepcopy(model), copy.deepcopy(model)
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)
    if groups == "list":
        groups = [[model.fc1.weight, model.fc2.weight], [model.fc2.bias]]
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                   compression=compression or hvd.Compression.none, backward_passes_per_step=bpps,
                                   op=op, gradient_predivide_factor=predivide, groups=groups)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=momentum)
    rows = MICRO * bpps * n
    for step in range(STEPS):
        x, y = quarters(f"x{step}", (rows, 6)), quarters(f"y{step}", (rows, 3))
        opt.zero_grad()
        for k in range(bpps):
            lo = (r * bpps + k) * MICRO
            (F.mse_loss(model(x[lo:lo + MICRO]), y[lo:lo + MICRO]) / bpps).backward()
        if explicit_sync:
            opt.synchronize()
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        ref_opt.zero_grad()
        # Average over ranks of per-rank means = mean over the concatenated batch; Sum is n times it.
        (F.mse_loss(ref(x), y) * (n if op == hvd.Sum else 1)).backward()
        ref_opt.step()
    assert_trained_equal(model, ref, start, tol)


@case
def train_plain():
    run_equivalence()


@case
def train_accumulate_3():
    run_equivalence(bpps=3)


@case
def train_groups_int():
    run_equivalence(groups=2)


@case
def train_groups_list_accumulate():
    run_equivalence(bpps=2, groups="list")


@case
def train_op_sum():
    run_equivalence(op=hvd.Sum, momentum=0.0)


@case
def train_predivide():
    run_equivalence(predivide=2.0)


@case
def train_explicit_synchronize():
    run_equivalence(explicit_sync=True)


@case
def train_fp16_compression():
    # fp16 on the wire rounds gradients to 11 bits: close to, not equal to, the fp32 reference.
    run_equivalence(compression=hvd.Compression.fp16, tol=5e-3)


@case
def train_unused_parameters():
    """``aux`` is used by rank 0 only in even steps and by nobody in odd steps: hooks fire on some ranks
    or none, and synchronize() must still reduce it everywhere (zero gradient where unused)."""
    n, r = hvd.size(), hvd.rank()
    model = fresh(aux=True)
    ref, start = copy.deepcopy(model), copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = quarters(f"ux{step}", (MICRO * n, 6)), quarters(f"uy{step}", (MICRO * n, 3))
        opt.zero_grad()
        sl = slice(r * MICRO, (r + 1) * MICRO)
        F.mse_loss(model(x[sl], use_aux=(r == 0 and step % 2 == 0)), y[sl]).backward()
        opt.step()
        if step % 2 == 1 and float(model.aux.weight.grad.abs().max()) != 0.0:
            raise AssertionError("a parameter no rank used got a non-zero gradient")
        ref_opt.zero_grad()
        loss = sum(F.mse_loss(ref(x[j * MICRO:(j + 1) * MICRO], use_aux=(j == 0 and step % 2 == 0)),
                              y[j * MICRO:(j + 1) * MICRO]) for j in range(n)) / n
        loss.backward()
        if ref.aux.weight.grad is None:  # reference: an unused parameter is not touched at all
            for p in ref.aux.parameters():
                p.grad = torch.zeros_like(p)
        ref_opt.step()
    assert_trained_equal(model, ref, start)


class EmbedNet(nn.Module):
    def __init__(self, sparse: bool):
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=sparse)
        self.fc = nn.Linear(4, 2)

    def forward(self, idx):
        return self.fc(self.emb(idx).sum(1))


def run_sparse(sparse_as_dense: bool) -> None:
    n, r = hvd.size(), hvd.rank()
    model = seeded(EmbedNet(sparse=True), 7)
    ref = seeded(EmbedNet(sparse=False), 7)
    start = copy.deepcopy(ref)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), sparse_as_dense=sparse_as_dense)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 + step)
        idx = torch.randint(0, 10, (MICRO * n, 3), generator=g)
        y = quarters(f"sy{step}", (MICRO * n, 2))
        opt.zero_grad()
        sl = slice(r * MICRO, (r + 1) * MICRO)
        F.mse_loss(model(idx[sl]), y[sl]).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(idx), y).backward()
        ref_opt.step()
    assert_trained_equal(model, ref, start)


@case
def train_sparse_allgathered():
    run_sparse(sparse_as_dense=False)


@case
def train_sparse_as_dense():
    run_sparse(sparse_as_dense=True)


@case
def optimizer_misuse_then_recovery():
    """zero_grad() with reductions in flight and one backward pass too many raise AssertionError;
    step() after synchronize() outside skip_synchronize() warns once; training goes on afterwards."""
    r = hvd.rank()
    model = fresh()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    x, y = quarters("mx", (MICRO, 6)) + r, quarters("my", (MICRO, 3))
    F.mse_loss(model(x), y).backward()
    try:
        opt.zero_grad()
        raise AssertionError("zero_grad() with pending reductions did not raise")
    except AssertionError as exc:
        if "zero_grad" not in str(exc):
            raise
    try:
        F.mse_loss(model(x), y).backward()
        raise RuntimeError("a second backward pass with backward_passes_per_step=1 did not raise")
    except AssertionError as exc:
        if "backward_passes_per_step" not in str(exc):
            raise
    opt.step()  # completes the first pass's reductions
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.synchronize()
            opt.step()
    msgs = [w for w in caught if "skip_synchronize" in str(w.message)]
    if len(msgs) != 1:
        raise AssertionError(f"expected one warning about step() after synchronize(), got {len(msgs)}")
    grads = hvd.allgather(model.fc1.weight.grad.unsqueeze(0))
    if not all(torch.equal(grads[0], g) for g in grads):
        raise AssertionError("gradients differ between ranks after synchronize()")



def train_process_set():
    """Only the members of a process set {0, last} train together (the others do not take part); their
    result equals single-process training on the members' concatenated batch.

    Must run last in a session: ops of a subset advance the members' handle counter only, so unnamed
    ops after it would no longer match between members and non-members (as in Horovod)."""
    n, r = hvd.size(), hvd.rank()
    members = [0, n - 1]
    ps = hvd.add_process_set(members)
    try:
        if r not in members:
            return
        m = len(members)
        me = members.index(r)
        model = fresh()
        ref, start = copy.deepcopy(model), copy.deepcopy(model)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                       named_parameters=model.named_parameters(), process_set=ps)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
        for step in range(STEPS):
            x, y = quarters(f"psx{step}", (MICRO * m, 6)), quarters(f"psy{step}", (MICRO * m, 3))
            opt.zero_grad()
            F.mse_loss(model(x[me * MICRO:(me + 1) * MICRO]), y[me * MICRO:(me + 1) * MICRO]).backward()
            opt.step()
            ref_opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
        assert_trained_equal(model, ref, start)
        got = hvd.broadcast_object("from the last member" if r == n - 1 else None, root_rank=n - 1, process_set=ps)
        if got != "from the last member":
            raise AssertionError(f"broadcast_object over the process set returned {got!r}")
    finally:
        hvd.remove_process_set(ps)


# Cases that must end a session (after every other case).
LAST = [("train_process_set", train_process_set)]
