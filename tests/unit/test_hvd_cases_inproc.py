"""The multiproc Horovod-API cases (tests/multiproc/hvd_cases_*.py), run with ranks as threads: a fast
check of the training equivalence, every differentiable op's gradient, the broadcast/gather helpers,
broadcast_optimizer_state for every optimizer class, join, SyncBatchNorm and the coordinator's bit-vector
path and execution thread, for 2 and 3 ranks. The real-process runs are in tests/multiproc/test_hvd_training.py.
"""
from __future__ import annotations

import hvd_cases_coord
import hvd_cases_join
import hvd_cases_ops
import hvd_cases_optim
import hvd_cases_training
import pytest
from hvd_world import hvd_world

# warnings.catch_warnings is process-wide, so a case that counts warnings cannot run as threads.
THREAD_UNSAFE = {"optimizer_misuse_then_recovery", "average_and_op_errors_then_next_op",
                 "step_after_synchronize_warning_text"}
CASES = [c for c in (hvd_cases_training.CASES + hvd_cases_ops.CASES + hvd_cases_optim.CASES + hvd_cases_join.CASES
                     + hvd_cases_coord.CASES + hvd_cases_training.LAST)
         if c[0] not in THREAD_UNSAFE]


@pytest.mark.parametrize("world", [2, 3])
def test_cases_as_threads(world):
    def body(r):
        failed = []
        for name, fn in CASES:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - collect them all
                failed.append(f"rank {r}: {name}: {type(exc).__name__}: {exc}")
        return failed

    failures = [f for per_rank in hvd_world(world, body) for f in per_rank]
    assert not failures, "\n".join(failures)
