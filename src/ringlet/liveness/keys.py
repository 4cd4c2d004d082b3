"""Where liveness lives in the job's store; every key is under one prefix per job and ringlet session.

``{prefix}/hb/{rank}``     the rank's heartbeat counter (``add``)
``{prefix}/host/{rank}``   the rank's host name, written once
``{prefix}/done/{rank}``   set when the rank shuts ringlet down cleanly: its silence is no failure
``{prefix}/verdict``       the first silent rank found (JSON :class:`~.verdict.Verdict`), first writer wins
``{job}/dead/{rank}``      set by the rank's node agent when the rank exits with an error (JSON verdict)
``{job}/dead``             the ranks with a death record, appended as ``"r,"``
"""
from __future__ import annotations

import os

ROOT = "ringlet/live"


def job_prefix(environ=None) -> str:
    """The prefix of this job's liveness keys: the launcher's run id and restart count."""
    env = os.environ if environ is None else environ
    return f"{ROOT}/{env.get('TORCHELASTIC_RUN_ID', 'none')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def session_prefix(job: str, session: int) -> str:
    """The prefix of one ``ringlet.init`` session (the n-th init of every rank of the job)."""
    return f"{job}/s{session}"


HEARTBEAT, HOST, DONE, DEAD = "hb", "host", "done", "dead"


def of_rank(prefix: str, kind: str, rank: int) -> str:
    """The key of ``kind`` (:data:`HEARTBEAT`, :data:`HOST`, :data:`DONE` or :data:`DEAD`) of ``rank``."""
    return f"{prefix}/{kind}/{rank}"


def verdict(prefix: str) -> str:
    return f"{prefix}/verdict"


def dead_list(job: str) -> str:
    return f"{job}/{DEAD}"
