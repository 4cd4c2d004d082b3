"""One rank of the Horovod-API training job, run inside a real job:

    ringlet run -np N --transport T -- python tests/workers/hvd_training_worker.py OUT.json [MODULE ...]

Every rank runs the same cases in the same order (from ``hvd_cases_training`` and ``hvd_cases_ops``) and
rewrites ``OUT.json.rank<r>`` after each case, so a job killed by its timeout still shows how far each
rank got. Training cases run twice, in two init/shutdown sessions of the same processes: with the
default fusion threshold and with ``HOROVOD_FUSION_THRESHOLD=0``; the other cases run once.
Inputs are integer-valued (or multiples of 1/4) and derived from seeds, so every rank can compute the
single-process reference for the whole job by itself.

With MODULE arguments (sibling case modules such as ``hvd_cases_join``), only those modules' ``CASES``
run, in one session with the default fusion threshold.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback

import ringlet.torch as hvd

import hvd_cases_ops  # noqa: E402 - sibling modules; workers run as scripts
import hvd_cases_training  # noqa: E402

FUSION_SESSIONS = (("fusion_default", None), ("fusion_off", "0"))


def main(out: str, modules: list[str]) -> int:
    summary = {"rank": None, "size": None, "passed": [], "failed": [], "sections": {}}
    path = None

    def save():
        if path is not None:
            with open(path + ".tmp", "w") as f:
                json.dump(summary, f, indent=1)
            os.replace(path + ".tmp", path)

    sessions = FUSION_SESSIONS[:1] if modules else FUSION_SESSIONS
    for session, threshold in sessions:
        if threshold is None:
            os.environ.pop("HOROVOD_FUSION_THRESHOLD", None)
        else:
            os.environ["HOROVOD_FUSION_THRESHOLD"] = threshold
        hvd.init()
        summary["rank"], summary["size"] = hvd.rank(), hvd.size()
        path = f"{out}.rank{hvd.rank()}"
        if modules:
            cases = [c for m in modules for c in importlib.import_module(m).CASES]
        else:
            cases = list(hvd_cases_training.CASES)
            if session == "fusion_default":
                cases += hvd_cases_ops.CASES
            cases += hvd_cases_training.LAST
        t0 = time.monotonic()
        for name, fn in cases:
            label = f"{session}/{name}"
            try:
                fn()
                summary["passed"].append(label)
            except Exception as exc:  # noqa: BLE001 - every failure is reported, the job goes on
                summary["failed"].append({"case": label, "error": f"{type(exc).__name__}: {exc}",
                                          "trace": traceback.format_exc()[-3000:]})
            save()
        summary["sections"][session] = round(time.monotonic() - t0, 2)
        hvd.shutdown()
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
