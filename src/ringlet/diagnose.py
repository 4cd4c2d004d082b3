"""The analysis behind ``ringlet diagnose DIR``: every rank's flight record (:mod:`ringlet.flight`) read
back, a one-sentence verdict on why the job stopped, and a table per rank.

The verdicts, in the order they are looked for (the first that applies is given):

1. members of a group in different ops at the same sequence number (``kind``), or in the same op with
   a different shape or dtype (``shape``);
2. a rank of the world left no record (``missing``): it died or was killed before it could write one;
3. a rank made fewer calls on a group than the others, which wait in the next one (``fewer``);
4. a rank failed with ``PeerError`` naming a peer (``peer``), or failed otherwise (``failed``);
5. nothing differs (``consistent``).

Only a tool reads this module: the library's core never imports it.
"""
from __future__ import annotations

import glob
import json
import os
import re
import time
from dataclasses import dataclass, field

_NOUN = {"allreduce": "all-reduce", "allgather": "all-gather", "reduce_scatter": "reduce-scatter",
         "alltoall": "all-to-all", "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier"}
_ORDINAL = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth", 7: "seventh",
            8: "eighth", 9: "ninth", 10: "tenth"}


@dataclass
class Verdict:
    """``kind``: which verdict (see the module docstring); ``sentence``: it, in one sentence;
    ``table``: the per-rank lines that follow it."""

    kind: str
    sentence: str
    table: list[str] = field(default_factory=list)


def load(directory: str) -> dict[int, dict]:
    """Every ``rank-<R>.json`` in ``directory`` by rank; a clear ``ValueError`` when there are none."""
    if not os.path.isdir(directory):
        raise ValueError(f"{directory}: not a directory of flight records (rank-<R>.json)")
    dumps: dict[int, dict] = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.json"))):
        try:
            with open(path) as fh:
                d = json.load(fh)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a readable flight record ({exc})") from None
        dumps[int(d["rank"])] = d
    if not dumps:
        raise ValueError(f"{directory}: no flight records (rank-<R>.json) found")
    return dumps


def noun(kind: str, plural: bool = False) -> str:
    n = _NOUN.get(kind, kind)
    return n + "s" if plural else n


def a(kind: str) -> str:
    """``an all-reduce``, ``a broadcast``."""
    n = noun(kind)
    return ("an " if n[0] in "aeiou" else "a ") + n


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"


def group_text(gid: int, members) -> str:
    return "the world group" if gid == 0 else f"group {gid} (ranks {list(members)})"


def describe(rec: dict) -> str:
    """``shape [4], float32, train.py:12`` for a record."""
    parts = [f"shape {list(rec['shape'])}"] if rec.get("dtype") else []
    if rec.get("dtype"):
        parts.append(rec["dtype"])
    if rec.get("site"):
        parts.append(short_site(rec["site"]))
    return ", ".join(parts)


def short_site(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else site


def _by_group(dumps: dict[int, dict]) -> dict[int, dict[int, dict[int, dict]]]:
    """group id -> rank -> seq -> record (records that started only)."""
    out: dict[int, dict[int, dict[int, dict]]] = {}
    for rank, d in dumps.items():
        for rec in d["records"]:
            if rec.get("seq") is not None:
                out.setdefault(rec["group"], {}).setdefault(rank, {})[rec["seq"]] = rec
    return out


def _members(dumps: dict[int, dict], gid: int) -> tuple[int, ...]:
    for d in dumps.values():
        for rec in d["records"]:
            if rec["group"] == gid:
                return tuple(rec["ranks"])
    return ()


def _shape_key(rec: dict) -> tuple:
    """What must agree between members: ragged first dimensions of all-gathers and all-to-alls may differ."""
    shape = list(rec["shape"])
    if rec["kind"] in ("allgather", "alltoall"):
        shape = shape[1:]
    return (tuple(shape), rec["dtype"])


def find_mismatch(dumps: dict[int, dict]) -> Verdict | None:
    """The lowest sequence number of any group where members' records differ in op, shape or dtype."""
    for gid, per_rank in sorted(_by_group(dumps).items()):
        seqs = sorted(set().union(*(s.keys() for s in per_rank.values())))
        for seq in seqs:
            recs = {r: s[seq] for r, s in per_rank.items() if seq in s}
            v = _differ(recs, "kind", lambda rec: rec["kind"], gid, seq, dumps)
            if v is None:
                v = _differ(recs, "shape", _shape_key, gid, seq, dumps)
            if v is not None:
                return v
    return None


def _differ(recs: dict[int, dict], kind: str, key, gid: int, seq: int, dumps) -> Verdict | None:
    groups: dict = {}
    for r, rec in recs.items():
        groups.setdefault(key(rec), []).append(r)
    if len(groups) < 2:
        return None
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    (_, most), (_, odd) = ordered[0], ordered[1]
    x, y = recs[odd[0]], recs[most[0]]
    where = f"{group_text(gid, _members(dumps, gid))} seq {seq}"
    verb = "is" if len(odd) == 1 else "are"
    if kind == "kind":
        s = (f"{ranks_text(odd)} {verb} in {a(x['kind'])} ({describe(x)}) where {ranks_text(most)} "
             f"{'is' if len(most) == 1 else 'are'} in {a(y['kind'])} ({describe(y)}), {where}")
    else:
        s = (f"{ranks_text(odd)} called {a(x['kind'])} with {describe(x)} where {ranks_text(most)} "
             f"used {describe(y)}, {where}")
    return Verdict(kind, s)


def _failure_peer(rec: dict, own: int) -> int | None:
    """The peer a failure names: the error's ``rank``, else ``peer rank N`` or another rank in its text."""
    if rec.get("peer") is not None:
        return int(rec["peer"])
    text = rec.get("error", "")
    m = re.search(r"peer rank (\d+)", text)
    if m:
        return int(m.group(1))
    others = [int(n) for n in re.findall(r"rank (\d+)", text) if int(n) != own]
    return others[0] if others else None


def _stuck(dumps: dict[int, dict]) -> dict[int, dict]:
    """rank -> its last record, where that is running or failed (the op it was in at its dump)."""
    out = {}
    for r, d in dumps.items():
        recs = [rec for rec in d["records"] if rec.get("seq") is not None]
        if recs and recs[-1]["state"] in ("running", "failed"):
            out[r] = recs[-1]
    return out


def find_missing(dumps: dict[int, dict]) -> Verdict | None:
    size = max(d["world_size"] for d in dumps.values())
    missing = [r for r in range(size) if r not in dumps]
    if not missing:
        return None
    s = f"{ranks_text(missing)} left no flight record (died or was killed before writing one)"
    stuck = _stuck(dumps)
    if stuck:
        r0 = min(stuck)
        rec = stuck[r0]
        state = "failed" if rec["state"] == "failed" else "wait"
        s += (f"; {ranks_text(stuck)} {state} in {a(rec['kind'])} on "
              f"{group_text(rec['group'], rec['ranks'])} seq {rec['seq']} ({describe(rec)})")
        if rec.get("error_type"):
            s += f" with {rec['error_type']}: {rec['error']}"
    return Verdict("missing", s)


def find_fewer(dumps: dict[int, dict]) -> Verdict | None:
    """A group where some members stopped at a lower sequence number, outside any op on it, while the
    others went on: the behind ones made fewer calls."""
    for gid, per_rank in sorted(_by_group(dumps).items()):
        top = {r: max(s) for r, s in per_rank.items()}
        high = max(top.values())
        ahead = sorted(r for r, t in top.items() if t == high)
        behind = sorted(r for r, t in top.items() if t < high and per_rank[r][t]["state"] == "done")
        if not behind:
            continue
        rec = per_rank[ahead[0]][high]
        wrapped = not all(dumps[r].get("complete", True) for r in top)
        return Verdict("fewer", _fewer_sentence(gid, rec, per_rank, ahead, behind, wrapped))
    return None


def _fewer_sentence(gid, rec, per_rank, ahead, behind, wrapped) -> str:
    where = group_text(gid, rec["ranks"])
    state = {"done": "completed", "failed": "failed in", "running": "wait in"}.get(rec["state"], "wait in")
    if wrapped:
        head = (f"{ranks_text(behind)} stopped at seq {max(per_rank[behind[0]])} on {where} where "
                f"{ranks_text(ahead)} reached seq {rec['seq']}")
        return f"{head}; {ranks_text(ahead)} {state} seq {rec['seq']}, {a(rec['kind'])} ({describe(rec)})"

    def count(r):
        return sum(1 for x in per_rank[r].values() if x["kind"] == rec["kind"] and x["seq"] <= rec["seq"])

    n_behind, n_ahead = count(behind[0]), count(ahead[0])
    nth = _ORDINAL.get(n_ahead, f"{n_ahead}th")
    return (f"{ranks_text(behind)} made {n_behind} {noun(rec['kind'], n_behind != 1)} on {where} where "
            f"{ranks_text(ahead)} made {n_ahead}; {ranks_text(ahead)} {state} the {nth} ({describe(rec)})")


def find_failed(dumps: dict[int, dict]) -> Verdict | None:
    failed = {r: rec for r, rec in _stuck(dumps).items() if rec["state"] == "failed"}
    if not failed:
        return None
    r0 = min(failed)
    rec = failed[r0]
    peer = _failure_peer(rec, r0) if rec.get("error_type") == "PeerError" else None
    where = f"{a(rec['kind'])} on {group_text(rec['group'], rec['ranks'])} seq {rec['seq']} ({describe(rec)})"
    if peer is not None:
        return Verdict("peer", f"{ranks_text(failed)} failed in {where} with PeerError naming rank {peer}: "
                               f"{rec['error']}")
    return Verdict("failed", f"{ranks_text(failed)} failed in {where} with {rec['error_type']}: {rec['error']}")


def consistent(dumps: dict[int, dict]) -> Verdict:
    per_group = _by_group(dumps)
    tops = {gid: max(max(s) for s in per_rank.values()) for gid, per_rank in per_group.items()}
    stuck = _stuck(dumps)
    if not tops:
        return Verdict("consistent", "no mismatch found: no rank recorded a collective")
    if stuck:
        rec = stuck[min(stuck)]
        return Verdict("consistent", f"no mismatch found: every rank is at the same seq on every group; "
                                     f"{ranks_text(stuck)} wait in {a(rec['kind'])} on "
                                     f"{group_text(rec['group'], rec['ranks'])} seq {rec['seq']} ({describe(rec)})")
    values = set(tops.values())
    if len(values) == 1:
        return Verdict("consistent", f"no mismatch found: every rank completed seq {values.pop()} on every group")
    detail = ", ".join(f"{group_text(g, _members(dumps, g))} seq {n}" for g, n in sorted(tops.items()))
    return Verdict("consistent", f"no mismatch found: every rank completed the same seq on every group ({detail})")


def table(dumps: dict[int, dict]) -> list[str]:
    """One line per rank and group: last completed seq, the op it is in and since when, the call site."""
    head = f"{'rank':>4}  {'host':<12} {'group':>5} {'done':>5}  {'in':<28} {'since (UTC)':>18}  {'call site':<24} dump"
    lines = [head]
    for r, d in sorted(dumps.items()):
        groups: dict[int, list[dict]] = {}
        for rec in d["records"]:
            groups.setdefault(rec["group"], []).append(rec)
        reason = d.get("failure") or d.get("reason", "")
        for gid, recs in sorted(groups.items()) or [(None, [])]:
            done = max((x["seq"] for x in recs if x["state"] == "done"), default=None)
            last = recs[-1] if recs else None
            busy = last is not None and last["state"] != "done"
            what = f"{noun(last['kind'])} seq {last['seq']} {last['state']}" if busy else "-"
            since = _since(last, d["time"]) if busy else "-"
            site = short_site(last["site"]) if last else "-"
            lines.append(f"{r:>4}  {d.get('hostname', '')[:12]:<12} {'-' if gid is None else gid:>5} "
                         f"{'-' if done is None else done:>5}  {what:<28} {since:>18}  {site:<24} {reason[:60]}")
    return lines


def _since(rec: dict, dump_time: float) -> str:
    """``12:03:04.5 +4.2s``: when the op started (UTC) and how long it ran until it failed or was dumped."""
    t0 = rec["t_start"] or rec["t_enqueue"]
    t1 = rec["t_end"] or dump_time
    return time.strftime("%H:%M:%S", time.gmtime(t0)) + f".{int((t0 % 1) * 10)} +{t1 - t0:.1f}s"


def analyse(dumps: dict[int, dict]) -> Verdict:
    """The verdict on ``dumps`` (rank -> flight record), with its table."""
    v = find_mismatch(dumps) or find_missing(dumps) or find_fewer(dumps) or find_failed(dumps) or consistent(dumps)
    v.table = table(dumps)
    return v

