"""Mixture of experts over real processes: one ``ringlet run -np 4`` job (Gloo) whose cases live in
``moe_worker.py`` — ep_size 2 and 4 against the single-process reference, and training steps under
``moe_parallel`` and ``moe_zero_optimizers``."""
from __future__ import annotations

import pytest
from case_jobs import run_worker

CASES = ["equiv_ep2", "equiv_ep4", "train_ep2", "train_ep4", "zero_ep2"]


@pytest.mark.multiproc
def test_moe_job(tmp_path):
    ranks = run_worker("moe_worker.py", "torch", 4, tmp_path)
    for s in ranks:
        assert s["passed"] == CASES, s
