"""Every schedule builder over small worlds and awkward counts, with a digest of what it emits: the
frozen output of the tuple-of-``Transfer`` builders that the array builders must reproduce exactly.

``python tests/workers/schedule_cases.py`` rewrites ``data/schedule_digests.json`` from the builders in
the ``ringlet`` on the path (run it only to record a deliberate change of a schedule).
"""
from __future__ import annotations

import hashlib
import json
import pathlib

from ringlet.algorithms import (alltoall, barrier, binomial, direct, halving_doubling, hierarchical,
                                recursive_doubling, ring, torus, tree)
from ringlet.algorithms.schedule import even_split

DIGESTS = pathlib.Path(__file__).parent / "data" / "schedule_digests.json"
WORLDS = tuple(range(1, 10)) + (12, 16)
COUNTS = (0, 1, 2, 3, 5, 7, 13, 16, 31, 100, 1031)


def _layouts(p: int) -> list[tuple[int, ...]]:
    return sorted({tuple([0] * p), tuple(range(p)), tuple(r // 2 for r in range(p)),
                   tuple(r % 2 for r in range(p)), tuple(min(r, 1) for r in range(p)),
                   tuple(r // 4 for r in range(p)), tuple(int(r == p - 1) for r in range(p))})


def _ragged(p: int, n: int) -> tuple[int, ...]:
    return tuple((n * (r + 1) + 3 * r) % 5 for r in range(p))


def cases():
    """(label, thunk) for every builder and argument tuple the digests cover."""
    for p in WORLDS:
        for n in COUNTS:
            for name, mod in (("ring", ring), ("tree", tree), ("halving_doubling", halving_doubling),
                              ("recursive_doubling", recursive_doubling), ("direct", direct)):
                yield f"{name}.allreduce({p},{n})", (lambda m=mod, p=p, n=n: m.allreduce(p, n))
            for host_of in _layouts(p):
                yield (f"hierarchical.allreduce({p},{n},{host_of})",
                       lambda p=p, n=n, h=host_of: hierarchical.allreduce(p, n, h))
                yield f"torus.allreduce({p},{n},{host_of})", lambda p=p, n=n, h=host_of: torus.allreduce(p, n, h)
            for root in sorted({0, p // 2, p - 1}):
                yield f"binomial.broadcast({p},{n},{root})", lambda p=p, n=n, r=root: binomial.broadcast(p, n, r)
                yield f"binomial.reduce({p},{n},{root})", lambda p=p, n=n, r=root: binomial.reduce(p, n, r)
            counts = _ragged(p, n)
            even = tuple(c for _, c in even_split(n, p))
            for label, cs in (("ragged", counts), ("even", even)):
                for name, fn in (("ring.allgather", ring.allgather), ("ring.reduce_scatter", ring.reduce_scatter),
                                 ("ring.shift", ring.shift), ("direct.allgather", direct.allgather)):
                    yield f"{name}({p},{label} {cs})", (lambda f=fn, p=p, cs=cs: f(p, cs))
            send = tuple(tuple((r * 3 + d * 5 + n) % 4 for d in range(p)) for r in range(p))
            yield f"alltoall.pairwise({p},{n})", lambda p=p, s=send: alltoall.pairwise(p, s)
        yield f"barrier.dissemination({p})", lambda p=p: barrier.dissemination(p)


def canonical(sched) -> str:
    steps = [[(t.src, t.dst, t.offset, t.count, t.recv_offset, bool(t.reduce), t.src_buf, t.dst_buf)
              for t in step] for step in sched.steps]
    meta = sorted((k, repr(v)) for k, v in sched.meta.items())
    return repr((sched.name, sched.nranks, steps, meta))


def family(label: str) -> str:
    """The builder and world size of a case label: ``ring.allreduce(5,7)`` -> ``ring.allreduce p=5``."""
    name, args = label.split("(", 1)
    return f"{name} p={args.split(',')[0].rstrip(')')}"


def digests() -> dict[str, str]:
    """One digest per builder and world size, over all its cases in order."""
    acc: dict = {}
    for label, build in cases():
        acc.setdefault(family(label), hashlib.sha256()).update((label + canonical(build())).encode())
    return {k: h.hexdigest()[:20] for k, h in acc.items()}


PLAN_WORLDS = WORLDS + (24, 33)  # > 16 peers: the executor's vectorised overlap queries
PLAN_COUNTS = (0, 1, 7, 100)
PLAN_SEGMENTS = (1, 3, 64)


def plan_digest(algo: str, p: int) -> str:
    """Digest of every rank's compiled plan of all-reduce ``algo`` on ``p`` ranks (several counts,
    layouts and segment sizes)."""
    from ringlet import algorithms
    from ringlet.algorithms.executor import compile_plan

    h = hashlib.sha256()
    for n in PLAN_COUNTS:
        for host_of in (tuple(r // 2 for r in range(p)), tuple([0] * p)):
            sched = algorithms.ALLREDUCE[algo](p, n, host_of)
            for rank in range(p):
                for seg in PLAN_SEGMENTS:
                    h.update(repr(compile_plan(sched, rank, seg)).encode())
    return h.hexdigest()[:20]


def plan_digests() -> dict[str, str]:
    from ringlet import algorithms

    return {f"plan {algo} p={p}": plan_digest(algo, p) for algo in sorted(algorithms.ALLREDUCE) for p in PLAN_WORLDS}


def main() -> None:
    out = {**digests(), **plan_digests()}
    DIGESTS.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    print(f"{len(out)} digests -> {DIGESTS}")


if __name__ == "__main__":
    main()
