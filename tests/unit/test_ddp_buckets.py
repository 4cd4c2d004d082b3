"""DDP bucket layout: reverse registration order, a small first bucket, then buckets of the cap."""
import torch

from ringlet.torch.ddp import assign_buckets

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


def test_last_bucket_holds_the_leading_parameters_that_fit_its_cap():
    # Like the benchmark CNN: conv1, conv2, conv3 (come last in backward), then the big fc layers.
    ps = params(7, 300, 1150, 8200, 20)
    assert assign_buckets(ps, 25 << 20, 1 << 20) == [[4, 3], [2, 1, 0]]
    assert assign_buckets(ps, 25 << 20, 1 << 20, 1 << 20) == [[4, 3], [2], [1, 0]]


def test_last_bucket_cap_changes_nothing_when_everything_fits_or_nothing_does():
    small = params(10, 10, 10)
    assert assign_buckets(small, 25 << 20, 1 << 20, 1 << 20) == assign_buckets(small, 25 << 20, 1 << 20)
    big_first = params(2000, 10)
    assert assign_buckets(big_first, 25 << 20, 1 << 20, 1 << 20) == assign_buckets(big_first, 25 << 20, 1 << 20)
    mixed = params(10) + params(10, dtype=torch.float64) + params(10)
    assert sorted(assign_buckets(mixed, 25 << 20, 1 << 20, 1 << 20)) == [[0], [1], [2]]
