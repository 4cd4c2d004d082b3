"""Group tag slots travel in GROUP_BITS bits of every message tag. Groups that share two or more ranks
get different slots, and one such group too many is a clear error (found by the fuzz), not two
collectives whose messages are matched with each other. Groups that share at most one rank share slots,
so a job may create many more groups than there are slots."""
import pytest
import torch
from conftest import run_world

import ringlet
from ringlet.runtime import MAX_GROUPS


def test_one_overlapping_group_too_many_is_a_clear_error():
    def body(rank):
        for _ in range(MAX_GROUPS - 1):  # the world has slot 0
            ringlet.new_group([0, 1])
        with pytest.raises(RuntimeError, match="groups per session that share two or more ranks"):
            ringlet.new_group([0, 1])
        ringlet.new_group([1, 2])  # shares one rank with the [0, 1] groups: still fits
        return True

    assert run_world(3, body) == [True, True, True]


def test_slots_are_shared_only_by_groups_without_a_common_pair():
    def body(rank):
        made = [ringlet.new_group(r) for r in ([0, 1], [2, 3], [0, 2], [1, 3], [0, 1, 2], [3], [1, 2])]
        return [g.tag_slot for g in made]

    slots = run_world(4, body)
    assert slots[0] == slots[1] == slots[2] == slots[3]
    s01, s23, s02, s13, s012, s3, s12 = slots[0]
    assert s01 == s23 == s02 == s13 == 1  # pairwise at most one rank in common; the world holds slot 0
    assert s012 not in (0, s01) and s3 == 0
    assert s12 not in (0, s012)


def test_many_more_groups_than_slots_run_side_by_side():
    """4 ranks, about 3 × MAX_GROUPS groups of two ranks ({0,1}, {2,3}, {0,2}, {1,3} in turn: many share a
    slot), a collective on each with world collectives between them, the pairs running theirs at
    the same time: every result is the reference."""
    pairs = ([0, 1], [2, 3], [0, 2], [1, 3])
    n_groups = 4 * ((3 * MAX_GROUPS + 3) // 4)  # at least three times the slots, each pair as often

    def body(rank):
        groups = [ringlet.new_group(pairs[i % 4]) for i in range(n_groups)]
        assert len({g.tag_slot for g in groups}) < MAX_GROUPS
        out = {}
        for i, g in enumerate(groups):
            if rank in g:
                t = torch.full((257,), float(rank + 1) * (i + 1))
                ringlet.allreduce_async_(t, op="sum", group=g).wait()
                out[i] = t[0].item()
            if i % 16 == 0:
                w = torch.ones(5)
                ringlet.allreduce_(w, op="sum")
                assert w.tolist() == [4.0] * 5
        return out

    results = run_world(4, body)
    for rank, out in enumerate(results):
        assert len(out) == n_groups // 2
        for i, value in out.items():
            assert value == sum(r + 1 for r in pairs[i % 4]) * (i + 1), (rank, i)
