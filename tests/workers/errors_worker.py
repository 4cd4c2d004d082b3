"""Error behaviour with real processes, one rank of a job:

    ringlet run -np N --transport T -- python tests/workers/errors_worker.py checks OUT.json
    ringlet run -np N --transport T -- python tests/workers/errors_worker.py exit OUT.json

``checks``: the launcher's environment (RINGLET_*/HOROVOD_* per rank agree with what the runtime
derives from the hostname exchange), mismatched shapes / dtypes / ops across ranks raise
:class:`MismatchError` on every rank and the next collective still works, then the last rank leaves
the job and the survivors' next collective raises PeerError or CollectiveTimeout instead of hanging.
Each rank writes ``OUT.json.rank<r>``.

``sleep``: every rank waits to be interrupted (the launcher's SIGINT forwarding).

``exit``: rank 1 fails with a traceback and exit status 17 while the others wait for it inside a
collective (they then fail too, with status 1): ``ringlet run`` must report rank 1's 17.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch

import ringlet
from ringlet.types import CollectiveTimeout, MismatchError, PeerError

from envcheck import env_checks  # noqa: E402 - sibling module; workers run as scripts

EXIT_STATUS = 17


def expect_mismatch(name: str, fn, results: dict) -> None:
    try:
        fn()
        results[name] = "no error"
    except MismatchError as exc:
        results[name] = "MismatchError"
        results[name + " message"] = str(exc)
    except Exception as exc:  # noqa: BLE001
        results[name] = f"{type(exc).__name__}: {exc}"
    # The next collective works and is correct.
    out = ringlet.allreduce(torch.ones(6), op="sum")
    results[name + " then"] = "ok" if torch.equal(out, torch.full((6,), float(ringlet.size()))) else f"wrong {out}"


def mismatch_checks(r: int, p: int) -> dict:
    res: dict = {}
    expect_mismatch("shape", lambda: ringlet.allreduce(torch.ones(4 if r == 0 else 5)), res)
    expect_mismatch("dtype", lambda: ringlet.allreduce(torch.ones(4, dtype=torch.float32 if r == 0 else torch.float64)), res)
    expect_mismatch("op", lambda: ringlet.allreduce(torch.ones(4), op="sum" if r == 0 else "max"), res)
    expect_mismatch("allgather trailing dims", lambda: ringlet.allgather(torch.ones(2, 3 if r == 0 else 4)), res)
    expect_mismatch("broadcast root", lambda: ringlet.broadcast(torch.ones(3), 0 if r == 0 else p - 1), res)
    # Different collectives on different ranks (all-gather exchanges sizes its own way): still a clear error.
    expect_mismatch("collective kind", lambda: ringlet.allgather(torch.ones(2, 3)) if r == 0
                    else ringlet.allreduce(torch.ones(2, 3)), res)
    return res


def dead_peer(r: int, p: int, result: dict, out: str) -> None:
    """The last rank leaves; the others' next collective must fail, not hang."""
    victim = p - 1
    ringlet.barrier()
    if r == victim:
        result["role"] = "victim"
        write(out, r, result)
        if ringlet.collectives.runtime().transport.name == "mpi":
            # Hydra kills the whole job when a rank exits without MPI_Finalize; a clean finalize
            # lets the survivors see the silence themselves.
            from mpi4py import MPI

            ringlet.shutdown()
            MPI.Finalize()
        os._exit(0)
    time.sleep(0.5)  # let the victim go
    t0 = time.monotonic()
    try:
        ringlet.allreduce(torch.ones(1 << 16), op="sum")
        result["dead peer"] = "no error"
    except (PeerError, CollectiveTimeout) as exc:
        result["dead peer"] = type(exc).__name__
        result["dead peer message"] = str(exc)
    except Exception as exc:  # noqa: BLE001
        result["dead peer"] = f"unexpected {type(exc).__name__}: {exc}"
    result["dead peer seconds"] = round(time.monotonic() - t0, 2)
    result["role"] = "survivor"
    write(out, r, result)
    sys.stdout.flush()
    sys.stderr.flush()
    # The job is broken by design now; leave without a collective shutdown.
    os._exit(0)


def write(out: str, r: int, result: dict) -> None:
    with open(f"{out}.rank{r}", "w") as f:
        json.dump(result, f, indent=1)


def main() -> int:
    mode, out = sys.argv[1], sys.argv[2]
    ringlet.init()
    r, p = ringlet.rank(), ringlet.size()
    if mode == "checks":
        result = {"rank": r, "size": p, "env problems": env_checks(r, p),
                  "env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
                  "mismatch": mismatch_checks(r, p)}
        dead_peer(r, p, result, out)
        return 0
    if mode == "exit":
        ringlet.barrier()
        if r == 1:
            try:
                raise RuntimeError("boom from rank 1")
            except RuntimeError:
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(EXIT_STATUS)  # like a crash: no goodbye to the peers
        time.sleep(0.2)
        ringlet.allreduce(torch.ones(1000), op="sum")  # rank 1 never joins: PeerError/timeout here
        return 0
    if mode == "sleep":
        # Wait to be interrupted (SIGINT forwarded by the launcher), without ever talking to peers.
        open(f"{out}.ready{r}", "w").close()
        try:
            time.sleep(120)
        except KeyboardInterrupt:
            print(f"rank {r} got KeyboardInterrupt", flush=True)
            os._exit(128 + 2)
        return 1
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main())
