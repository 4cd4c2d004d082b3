"""The in-process side of the fuzz: hypothesis settings, hypothesis as a :class:`fuzz_cases.Draw`, and a
world of ranks as threads whose every run is bounded (a rank still running at the bound fails the test
as a hang).

Every fuzz test runs twice over: a smoke budget on a few world sizes in the default suite, and the
full budget on every world size it names, marked ``slow`` (``make test-slow``; see :func:`fuzz_grid`).
``RINGLET_FUZZ_EXAMPLES`` multiplies the number of examples of every fuzz test (a long campaign:
``RINGLET_FUZZ_EXAMPLES=10``); ``RINGLET_FUZZ_TIMEOUT`` is each collective's timeout in seconds
in cases with faults (default 2: cases where a rank sits out or fails locally end in the others'
CollectiveTimeout). Clean cases, which must not time out, run with ``CLEAN_TIMEOUT`` (30 s), so that a
loaded machine cannot fail them.
"""
from __future__ import annotations

import os

import pytest
from fuzz_cases import Draw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ringlet
from ringlet.runtime import Runtime
from ringlet.transport.inproc import InprocWorld
from ringlet.types import Options, RingletError

SCALE = max(1, int(os.environ.get("RINGLET_FUZZ_EXAMPLES", "1") or "1"))
OP_TIMEOUT = float(os.environ.get("RINGLET_FUZZ_TIMEOUT", "2") or "2")
CLEAN_TIMEOUT = 30.0
HANG_LIMIT = 90.0  # a world still running after this long is a hang


def fuzz_settings(examples: int):
    """Hypothesis settings of a fuzz test: ``examples`` times ``RINGLET_FUZZ_EXAMPLES``, no deadline."""
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz_grid(smoke: dict[int, int], full: dict[int, int]) -> list:
    """``(p, examples)`` parameters of a fuzz test: ``smoke`` (world size -> examples) in the default
    suite, ``full`` marked ``slow``."""
    return ([pytest.param(p, n, id=f"{p}-smoke") for p, n in smoke.items()]
            + [pytest.param(p, n, id=f"{p}-full", marks=pytest.mark.slow) for p, n in full.items()])


def run_fuzz(examples: int, body) -> None:
    """Run ``body(data)`` as a hypothesis property with ``examples`` examples (:func:`fuzz_settings`)."""

    @fuzz_settings(examples)
    @given(data=st.data())
    def prop(data):
        body(data)

    prop()


class HypothesisDraw(Draw):
    """Choices drawn from hypothesis' ``data`` (so that failing cases shrink)."""

    def __init__(self, data):
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))


def run_ranks(p: int, fn, *, timeout: float = OP_TIMEOUT) -> list:
    """``fn(rank)`` on ``p`` in-process ranks, each with its own runtime (collective ``timeout``);
    results in rank order. A rank whose runtime could not start (its hostname exchange timed out on a
    loaded machine) gives ``{"status": "setup"}`` (see :func:`usable`). ``AssertionError`` naming the
    hang when some rank has not finished after ``HANG_LIMIT`` seconds."""
    opts = Options(timeout=timeout, tune="off")
    world = InprocWorld(p)

    def body(tr):
        try:
            rt = Runtime(tr, opts)
        except RingletError as exc:
            return {"status": "setup", "error": f"{type(exc).__name__}: {exc}"}
        with ringlet.use_runtime(rt):
            try:
                return fn(tr.rank)
            finally:
                rt.close()

    try:
        return world.run(body, timeout=HANG_LIMIT)
    except TimeoutError as exc:
        if isinstance(exc, RingletError):
            raise  # a rank's own error that escaped the case
        raise AssertionError(f"hang: {exc}") from None


def usable(outcomes: list) -> bool:
    """False when some rank could not even start (the example is discarded, not judged)."""
    return not any(isinstance(o, dict) and o.get("status") == "setup" for o in outcomes)
