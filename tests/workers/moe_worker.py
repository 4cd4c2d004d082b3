"""One rank of the mixture-of-experts job:

    ringlet run -np 4 --transport torch -- python tests/workers/moe_worker.py OUT.json

Cases, in order (``moe_cases`` holds the models and the single-process reference):

* ``equiv_ep2``, ``equiv_ep4``: an unwrapped MoE layer with ep_size 2 (two expert-parallel groups) and 4,
  k 1 and 2, capacity factor 16 (nothing dropped) and 0.5 (many drops): output, aux loss, dropped count,
  gate and expert gradients equal the reference (fp32, 1e-5);
* ``train_ep2``, ``train_ep4``: SGD steps under ``moe_parallel`` (experts averaged over their 2 replicas,
  or alone) equal the reference's steps on all ranks' batches;
* ``zero_ep2``: the same with ``moe_zero_optimizers`` (ZeRO stage 2).
"""
from __future__ import annotations

import torch
from case_harness import check, worker_main
from moe_cases import check_training, check_unwrapped


def equivalence(ep: int):
    def case(numbers: dict) -> None:
        for k in (1, 2):
            for cf in (16.0, 0.5):
                for err in check_unwrapped(ep, k, cf):
                    check(False, err)
    return case


def training(ep: int, zero_stage: int | None = None):
    def case(numbers: dict) -> None:
        for err in check_training(ep, 2, 16.0, steps=3, zero_stage=zero_stage) + \
                check_training(ep, 1, 0.5, steps=2, zero_stage=zero_stage):
            check(False, err)
    return case


def make_cases(rank: int, world: int):
    assert world == 4, "the MoE job runs on 4 ranks"
    torch.manual_seed(0)
    return [("equiv_ep2", equivalence(2)), ("equiv_ep4", equivalence(4)), ("train_ep2", training(2)),
            ("train_ep4", training(4)), ("zero_ep2", training(2, zero_stage=2))]


if __name__ == "__main__":
    raise SystemExit(worker_main(make_cases))
