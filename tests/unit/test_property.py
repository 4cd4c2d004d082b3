"""Property test: random short programs of random collectives on random sizes and world sizes agree
with the reference. Each example is one in-process world running the whole program in order, so
tag sequencing, scratch reuse and algorithm switching between consecutive collectives are exercised."""
from __future__ import annotations

import torch
from conftest import OPS, make_input, run_world
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ringlet
from ringlet import algorithms
from ringlet.algorithms import reference
from ringlet.types import SUPPORTED_DTYPES, Options

ALGOS = sorted(n for n in algorithms.ALLREDUCE if n != algorithms.NATIVE) + ["auto"]


@st.composite
def programs(draw):
    p = draw(st.integers(1, 6))
    steps = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall"]))
        dtype = draw(st.sampled_from(SUPPORTED_DTYPES))
        if kind == "allreduce":
            spec = dict(algo=draw(st.sampled_from(ALGOS)), op=draw(st.sampled_from(OPS)), n=draw(st.integers(0, 300)))
        elif kind == "broadcast":
            spec = dict(root=draw(st.integers(0, p - 1)), n=draw(st.integers(0, 100)))
        elif kind == "allgather":
            spec = dict(rows=draw(st.lists(st.integers(0, 4), min_size=p, max_size=p)), cols=draw(st.integers(1, 3)))
        elif kind == "reduce_scatter":
            spec = dict(rows=draw(st.integers(0, 2 * p + 1)), cols=draw(st.integers(1, 3)),
                        op=draw(st.sampled_from(OPS)))
        else:
            spec = dict(splits=draw(st.lists(st.lists(st.integers(0, 3), min_size=p, max_size=p),
                                             min_size=p, max_size=p)), cols=draw(st.integers(1, 2)))
        steps.append((kind, dtype, i, spec))
    segment_bytes = draw(st.sampled_from([16, 200, 1 << 20]))
    return p, steps, segment_bytes


def _inputs(p, kind, dtype, seed, spec):
    op = spec.get("op", OPS[0])
    if kind in ("allreduce", "broadcast"):
        return [make_input(r, spec["n"], dtype, op, seed) for r in range(p)]
    if kind == "allgather":
        return [make_input(r, spec["rows"][r] * spec["cols"], dtype, op, seed).reshape(-1, spec["cols"])
                for r in range(p)]
    if kind == "reduce_scatter":
        return [make_input(r, spec["rows"] * spec["cols"], dtype, op, seed).reshape(-1, spec["cols"])
                for r in range(p)]
    return [make_input(r, sum(spec["splits"][r]) * spec["cols"], dtype, op, seed).reshape(-1, spec["cols"])
            for r in range(p)]


def _call(kind, spec, t, rank):
    if kind == "allreduce":
        return ringlet.allreduce(t, op=spec["op"], algorithm=spec["algo"])
    if kind == "broadcast":
        return ringlet.broadcast(t, spec["root"])
    if kind == "allgather":
        return ringlet.allgather(t)
    if kind == "reduce_scatter":
        return ringlet.reduce_scatter(t, op=spec["op"])
    return ringlet.alltoall(t, splits=spec["splits"][rank])[0]


def _expected(kind, spec, ins):
    if kind == "allreduce":
        return reference.allreduce(ins, spec["op"])
    if kind == "broadcast":
        return reference.broadcast(ins, spec["root"])
    if kind == "allgather":
        return reference.allgather(ins)
    if kind == "reduce_scatter":
        return reference.reduce_scatter(ins, spec["op"])
    return reference.alltoall(ins, spec["splits"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_match_reference(program):
    p, steps, segment_bytes = program
    inputs = [_inputs(p, kind, dtype, seed, spec) for kind, dtype, seed, spec in steps]

    def fn(rank):
        return [_call(kind, spec, ins[rank], rank) for (kind, _, _, spec), ins in zip(steps, inputs)]

    outs = run_world(p, fn, options=Options(timeout=20, segment_bytes=segment_bytes))
    for i, ((kind, dtype, _, spec), ins) in enumerate(zip(steps, inputs)):
        expected = _expected(kind, spec, ins)
        for r in range(p):
            got = outs[r][i]
            assert got.dtype == expected[r].dtype and got.shape == expected[r].shape, (i, kind, spec, r)
            assert torch.equal(got, expected[r]), (i, kind, dtype, spec, r, got, expected[r])
