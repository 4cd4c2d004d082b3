"""DDP bucket layout: reverse registration order, a small first bucket, then buckets of the cap."""
import torch

from ringlet.torch.training.buckets import assign_buckets

KB = 1024


def params(*sizes_kb, dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(int(s * KB) // 4, dtype=dtype)) for s in sizes_kb]


def test_first_bucket_small_then_cap_and_reverse_order():
    ps = params(100, 100, 100, 100, 100, 100)
    assert assign_buckets(ps, 250 * KB, 150 * KB) == [[5, 4], [3, 2, 1], [0]]


def test_dtypes_never_share_a_bucket():
    mixed = params(10) + params(10, dtype=torch.float64) + params(10)
    layout = assign_buckets(mixed, 25 << 20, 1 << 20)
    assert sorted(layout) == [[1], [2, 0]]
