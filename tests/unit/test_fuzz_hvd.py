"""Hypothesis fuzz of the Horovod facade (``ringlet.torch``) on the in-process transport, world sizes 1 to
6: every op kind and form, names, dtypes, views, NaN and infinities, and ranks calling with different
arguments (see :mod:`fuzz_hvd`). Every rank returns the reference or raises a clear exception; no hang. A smoke budget runs by
default, the full one is marked ``slow``."""
from __future__ import annotations

import os

import pytest
import torch
from fuzz_hvd import HCall, HCase, draw_hcase, hvd_judge, hvd_rank_body
from fuzz_world import CLEAN_TIMEOUT, OP_TIMEOUT, HypothesisDraw, fuzz_grid, run_fuzz, run_ranks, usable
from hypothesis import assume

import ringlet.torch as hvd

STALL_SHUTDOWN = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"


@pytest.fixture(scope="module", autouse=True)
def stall_shutdown():
    """Names some ranks never submit end in HorovodInternalError (after the case's timeout: each case
    sets it); the variable is restored after the module."""
    old = os.environ.get(STALL_SHUTDOWN)
    yield
    if old is None:
        os.environ.pop(STALL_SHUTDOWN, None)
    else:
        os.environ[STALL_SHUTDOWN] = old


def check_hcase(case: HCase) -> None:
    def body(r):
        try:
            hvd.init()
        except Exception as exc:  # noqa: BLE001 - a coordinator that could not start on a loaded machine
            return {"status": "setup", "error": f"{type(exc).__name__}: {exc}"}
        try:
            return hvd_rank_body(case, r)
        finally:
            hvd.shutdown()

    limit = CLEAN_TIMEOUT if case.clean else OP_TIMEOUT
    os.environ[STALL_SHUTDOWN] = str(limit)  # read by hvd.init() on every rank
    outcomes = run_ranks(case.p, body, timeout=limit)
    if not usable(outcomes):
        assume(False)  # a rank could not start: discard the example
    problems = [p for r, res in enumerate(outcomes) for p in hvd_judge(case, r, res)]
    assert not problems, f"{case}\n" + "\n".join(problems) + f"\noutcomes: {outcomes}"


@pytest.mark.parametrize("p,examples", fuzz_grid({3: 8}, {p: 40 for p in (1, 2, 3, 5)}))
def test_clean_ops_match_reference(p, examples):
    run_fuzz(examples, lambda data: check_hcase(draw_hcase(HypothesisDraw(data), p, faults=False)))


@pytest.mark.parametrize("p,examples", fuzz_grid({2: 6, 4: 6}, {p: 30 for p in (2, 3, 4, 6)}))
def test_any_ops_reference_or_clear_error(p, examples):
    run_fuzz(examples, lambda data: check_hcase(draw_hcase(HypothesisDraw(data), p)))


# ---- regressions: what the fuzz found ------------------------------------------------------------------
def _hcase(p, calls, faults=(), local=()):
    return HCase(p, 11, False, tuple(calls), tuple(faults), frozenset(local))


@pytest.mark.parametrize("name", ["\udcff", "x" * 70000])
def test_unencodable_or_overlong_name_is_refused(name):
    for kind in ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter"):
        call = HCall(kind, shapes=((2,),), splits=[1, 1] if kind == "alltoall" else None, name=name)
        check_hcase(_hcase(2, [call] * 2, ["name_bad@0", "name_bad@1"], {0, 1}))


def test_a_name_only_some_ranks_submit_ends_in_an_error():
    ok = HCall("allreduce", name="a")
    check_hcase(_hcase(3, [ok, HCall("allreduce", name="b"), ok], ["name@1"]))
    check_hcase(_hcase(2, [ok, HCall("allreduce", calls=False)], ["skip@1"]))
    check_hcase(_hcase(2, [ok, HCall("allreduce", name="a", dtype=torch.bool)], ["dtype_bad@1"], {1}))


def test_meta_tensor_is_refused():
    check_hcase(_hcase(2, [HCall("allreduce", layout="meta")] * 2, ["meta@0", "meta@1"], {0, 1}))


def test_reducescatter_with_min_is_refused_at_the_call():
    """The contract: HorovodInternalError at the call (on every rank), nothing submitted."""
    calls = [HCall("reducescatter", shapes=((4,),), op=hvd.Min)] * 3
    check_hcase(_hcase(3, calls, ["op_bad@0", "op_bad@1", "op_bad@2"], {0, 1, 2}))
