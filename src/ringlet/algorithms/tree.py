"""Double binary tree all-reduce (after Sanders, Speck & Träff 2009; the shape NCCL uses).

One binary tree has ~p/2 interior ranks that each receive from two children and send to one parent,
while the leaves only send: half the ranks' links sit idle. Two trees, each carrying half of the
vector, fix that when every rank is interior in at most one of them: then every rank sends and
receives about the same volume in each phase.

Construction. Label the ranks ``1..p`` and use the in-order tree of the binary numbers: the height
of label ``x`` is the index of its lowest set bit, so odd labels are leaves; ``x`` with lowest bit
``b`` has left child ``x - b/2`` and, as right child, ``x + h`` for the largest ``h`` in
``b/2, b/4, ..., 1`` that stays ``<= p`` (the part of the right subtree that exists). The root is the
largest power of two ``<= p``.

* tree 0 maps label ``x`` to rank ``x - 1``: interior ranks are the odd ranks;
* tree 1 maps label ``x`` to rank ``x mod p`` (tree 0 shifted by one rank): interior ranks are even.

So the interior sets are disjoint for every ``p`` (for odd ``p`` rank 0 is a leaf in both trees).
Tree 0 reduces and broadcasts the first half of the vector, tree 1 the second half.

Steps are indexed by height: a rank of height ``h`` sends its partial sum to its parent at step ``h``
(all its children have smaller heights, so their data has arrived), and in the broadcast a rank of
height ``h`` sends the result to its children at step ``2H - h`` (``H = floor(log2 p)``, the root's
height). Both trees share steps, and because a rank's send at step ``s+1`` covers the ranges it
receives at step ``s``, the executor's segmentation pipelines segments up and then down the trees.

Cost: ``2⌊log₂p⌋`` steps. Per rank, about ``n`` elements go up (``n/2`` per tree) and at most ``n``
come down (an interior rank sends its half to two children), so with segments of ``s`` elements the
pipelined time is about ``2⌊log₂p⌋(α + sβ) + 2nβ + nγ`` against the ring's ``2(p-1)α + 2(p-1)/p·nβ``:
the tree wins on latency at large ``p`` and moderate ``n``.
"""
from __future__ import annotations

import functools

import numpy as np

from .cache import cached
from .schedule import Schedule, ScheduleBuilder, split_table


def _lowbit(x: int) -> int:
    return x & -x


def _label_children(x: int, p: int) -> list[int]:
    """Children of label ``x`` in the in-order tree restricted to labels ``1..p``."""
    half = _lowbit(x) >> 1
    if half == 0:
        return []
    kids = [x - half]  # the whole left subtree lies below x, so it always exists
    h = half
    while h and x + h > p:
        h >>= 1
    if h:
        kids.append(x + h)
    return kids


@functools.lru_cache(maxsize=64)
def trees(p: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Parent rank of every rank in tree 0 and tree 1 (``-1`` for the roots).

    Exposed for tests and for the simulator: a rank is interior in a tree when some rank names it
    as parent; no rank is interior in both.
    """
    if p < 1:
        raise ValueError(f"a tree needs at least one rank, got p={p}")
    parents = []
    for to_rank in (lambda x: x - 1, lambda x: x % p):
        parent = [-1] * p
        for x in range(1, p + 1):
            for c in _label_children(x, p):
                parent[to_rank(c)] = to_rank(x)
        parents.append(tuple(parent))
    return parents[0], parents[1]


@functools.lru_cache(maxsize=64)
def _edges(p: int) -> tuple[np.ndarray, ...]:
    """Every (tree, parent label, child) edge in the order of tree, then label, then left before right:
    arrays ``tree``, ``parent`` rank, ``child`` rank, the child's and the parent's heights."""
    rows = []
    for t, to_rank in enumerate((lambda x: x - 1, lambda x: x % p)):
        for x in range(1, p + 1):
            for c in _label_children(x, p):
                rows.append((t, to_rank(x), to_rank(c), _lowbit(c).bit_length() - 1, _lowbit(x).bit_length() - 1))
    cols = tuple(np.array(col, dtype=np.int64) for col in zip(*rows)) if rows else (np.zeros(0, np.int64),) * 5
    for col in cols:
        col.flags.writeable = False
    return cols


@cached
def allreduce(p: int, count: int) -> Schedule:
    """Double binary tree all-reduce of ``count`` elements over ``p`` ranks (any ``p >= 1``).

    Reduce up both trees (children reduce into parents, by height), then broadcast down (parents
    copy the result into their children). ``2⌊log₂p⌋`` steps; see the module docstring for the cost.
    """
    b = ScheduleBuilder("tree", p)
    if p == 1:
        return b.build(trees=((-1,), (-1,)))
    top = p.bit_length() - 1  # the root's height, floor(log2 p)
    halves = b.ranges(*split_table(count, 2))  # tree t carries half t
    tree_of, parent, child, child_height, parent_height = _edges(p)
    for s in range(top):  # up: a child of height s reduces into its parent
        on = child_height == s
        b.new_step()
        b.add_ranges(child[on], parent[on], halves, tree_of[on], reduce=True)
    for s in range(top, 2 * top):  # down: a parent of height 2top - s copies into its children
        on = parent_height == 2 * top - s
        b.new_step()
        b.add_ranges(parent[on], child[on], halves, tree_of[on])
    return b.build(trees=trees(p))
