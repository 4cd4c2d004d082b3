"""The compressed comm hooks for stock torch DDP, in-process with a stand-in for torch's ``GradBucket``
(real DDP over Gloo is in tests/multiproc/test_compressed.py)."""
from __future__ import annotations

import pytest
import torch
from conftest import run_world
from test_compressed_allreduce import inputs, ref_scatter
from testonly_compressors import FakeCustom, FakeTopK

from ringlet import compression
from ringlet.compression import BF16, FP16
from ringlet.torch import hooks


class Bucket:
    """What the hooks use of ``torch.distributed.GradBucket``."""

    def __init__(self, index: int, params: list[torch.Tensor], buffer: torch.Tensor):
        self._index, self._params, self._buffer = index, params, buffer

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list[torch.Tensor]:
        return self._params


def bucket_of(rank: int, p: int, index: int = 0, shapes=((4, 5), (7,))) -> Bucket:
    params = [torch.zeros(s) for s in shapes]
    n = sum(t.numel() for t in params)
    return Bucket(index, params, inputs(p, n, seed=index)[rank].clone())


@pytest.mark.parametrize("hook,comp", [(hooks.fp16_compress_hook, FP16), (hooks.bf16_compress_hook, BF16)])
def test_half_hooks_average_with_float32_accumulation(hook, comp):
    p = 3

    def fn(rank):
        st = hooks.HookState()
        return [hook(st, bucket_of(rank, p, i)).wait() for i in range(3)], st

    res = run_world(p, fn)
    for i in range(3):
        want = ref_scatter([bucket_of(r, p, i).buffer() for r in range(p)], comp, True)
        assert all(torch.equal(out[i], want) for out, _ in res)
    assert {i: b.calls for i, b in res[0][1].buckets.items()} == {0: 1, 1: 1, 2: 1}


def test_compressed_hook_uses_the_states_compressor_and_keeps_state_per_bucket_and_layout():
    p = 2

    def fn(rank):
        st = hooks.HookState(compression=FakeCustom())
        first = hooks.compressed_hook(st, bucket_of(rank, p, 0)).wait()
        hooks.compressed_hook(st, bucket_of(rank, p, 1, shapes=((3, 3),))).wait()
        keys0 = list(st.bucket(0).data)
        comp_state = st.bucket(0).data[keys0[0]]
        # torch rebuilt bucket 0 with other parameters: its compressor state starts afresh.
        hooks.compressed_hook(st, bucket_of(rank, p, 0, shapes=((2, 2), (5,)))).wait()
        assert len(st.compression_states()) == 2 and all(s["calls"] == 1 for s in st.compression_states())
        return first, keys0, comp_state, list(st.bucket(0).data)

    for first, keys0, comp_state, keys_after in run_world(p, fn):
        assert keys0 == [("compression", "fake-custom", ((4, 5), (7,)))]
        assert comp_state["shapes"] == [(4, 5), (7,)] and comp_state["calls"] == 1
        assert keys_after == [("compression", "fake-custom", ((2, 2), (5,)))]
        want = sum(x.half().float().double() for x in (bucket_of(r, p).buffer() for r in range(p))) / p
        torch.testing.assert_close(first.double(), want)


def test_sparse_compressor_through_the_hook():
    def fn(rank):
        return hooks.compressed_hook(hooks.HookState(compression=FakeTopK()), bucket_of(rank, 2)).wait()

    res = run_world(2, fn)
    assert torch.equal(res[0], res[1])


def test_compressed_hook_without_a_compressor_is_an_error():
    def fn(rank):
        with pytest.raises(ValueError, match="HookState\\(compression"):
            hooks.compressed_hook(hooks.HookState(), bucket_of(rank, 1))
        return True

    assert run_world(1, fn) == [True]


def _known(name: str) -> bool:
    try:
        compression.get(name)
    except ValueError:
        return False
    return True


NAMED = [(hooks.int8_ef_hook, "int8+ef"), (hooks.topk_ef_hook, "topk:0.01+ef"),
         (hooks.powersgd_hook, "powersgd:2")]


@pytest.mark.parametrize("hook,name", NAMED, ids=[n for _, n in NAMED])
def test_named_hooks_keep_ranks_in_step(hook, name):
    assert _known(name), name
    p = 3

    def fn(rank):
        st = hooks.HookState()
        outs = []
        for step in range(3):
            b = bucket_of(rank, p, 0, shapes=((16, 8), (8,)))
            outs.append(hook(st, b).wait())
        return outs

    res = run_world(p, fn)
    for step in range(3):
        assert all(torch.equal(r[step], res[0][step]) for r in res)
        assert torch.isfinite(res[0][step]).all()


@pytest.mark.parametrize("hook,name", NAMED + [(hooks.compressed_hook, "compressed_hook")],
                         ids=[n for _, n in NAMED] + ["compressed_hook"])
def test_a_stateful_compressed_hook_given_no_state_raises_and_says_what_to_pass(hook, name):
    """torch accepts state=None; a compressor keeping state between steps would silently start afresh at
    every call (no error feedback, no warm start), so the hook refuses and names HookState."""
    def fn(rank):
        with pytest.raises(ValueError, match=r"state=None.*HookState\(\)"):
            hook(None, bucket_of(rank, 1, 0, shapes=((16, 8), (8,))))
        return True

    assert run_world(1, fn) == [True]


@pytest.mark.parametrize("hook,comp", [(hooks.fp16_compress_hook, FP16), (hooks.bf16_compress_hook, BF16)])
def test_stateless_compressed_hooks_and_the_plain_hook_accept_no_state(hook, comp):
    p = 2

    def fn(rank):
        return hook(None, bucket_of(rank, p)).wait(), hooks.allreduce_hook(None, bucket_of(rank, p)).wait()

    res = run_world(p, fn)
    want = ref_scatter([bucket_of(r, p).buffer() for r in range(p)], comp, True)
    assert all(torch.equal(half, want) for half, _ in res)
    assert torch.equal(res[0][1], res[1][1])
