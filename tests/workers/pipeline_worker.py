"""One rank of the pipeline job (a world of 4; of 2 or 8 for the other layouts):

    ringlet run -np 4 --transport T -- python tests/workers/pipeline_worker.py OUT.json

Cases, in order:

* ``p2p_beside_allreduce``: rank 0 posts a point-to-point round trip with rank 1 while its all-reduce,
  queued on the communication thread, waits for rank 1's (which comes after the round trip);
* ``equiv_{S}x{R}_{schedule}``: 2 stages × 2 replicas and 4 stages × 1 (2 × 1 in a world of 2, 4 × 2 in a
  world of 8), GPipe and 1F1B: three SGD steps
  end where the single-process model on the full batches does (1e-5), with the held micro-batches of the
  schedule (GPipe M, 1F1B at most S);
* ``fp16_2x2`` (a world of 4): the replica average compressed to fp16: close to the reference, replicas equal;
* ``zero1_2x2`` (a world of 4): ZeRO stage 1 over the replicas instead of the pipeline's DDP: the reference (1e-5).
"""
from __future__ import annotations

import sys

import torch
from case_harness import check, flat, worker_main
from pipe_cases import expected_peak, train

import ringlet


def case_p2p(rank: int, world: int):
    def run(numbers: dict) -> None:
        t = torch.full((1 << 16,), float(rank + 1))
        if rank == 0:
            work = ringlet.allreduce_async_(t, op="sum")
            ringlet.send(torch.tensor([1.0]), 1, tag=3)
            back = ringlet.recv(torch.empty(1), 1, tag=4)
            work.wait()
            check(back.item() == 2.0, f"round trip gave {back.item()}")
        else:
            if rank == 1:
                got = ringlet.recv(torch.empty(1), 0, tag=3)
                ringlet.send(got + 1, 0, tag=4)
            ringlet.allreduce_(t, op="sum")
        check(t[0].item() == world * (world + 1) / 2, f"all-reduce gave {t[0].item()}")
    return run


def case_equiv(stages: int, schedule: str, **kw):
    def run(numbers: dict) -> None:
        pipe, err, losses = train(stages, schedule, **kw)
        tol = 1e-2 if kw.get("compression") else 1e-5
        check(err < tol, f"stage {pipe.stage}: parameters {err:.2e} from the reference")
        check(pipe.stats.peak_inflight == expected_peak(pipe), f"held {pipe.stats.peak_inflight}")
        rows = ringlet.allgather(flat(pipe.parameters()).unsqueeze(0), group=pipe.replica_group)
        check(all(torch.equal(rows[0], row) for row in rows[1:]), "the replicas of a stage differ")
        numbers[f"{stages}_{schedule}_bubble_stage{pipe.stage}"] = round(pipe.stats.bubble, 3)
    return run


STAGES = {2: (2,), 4: (2, 4), 8: (4,)}  # world -> the pipeline depths it runs


def cases(rank: int, world: int) -> list:
    out = [("p2p_beside_allreduce", case_p2p(rank, world))]
    for stages in STAGES[world]:
        for schedule in ("gpipe", "1f1b"):
            out.append((f"equiv_{stages}x{world // stages}_{schedule}", case_equiv(stages, schedule, tune=False)))
    if world == 4:
        out.append(("fp16_2x2", case_equiv(2, "1f1b", compression="fp16", tune=False)))
        out.append(("zero1_2x2", case_equiv(2, "gpipe", zero=1)))
    return out


if __name__ == "__main__":
    sys.exit(worker_main(cases))
