"""``ringlet report trace.json``: how much communication hid behind compute, step by step, and the
stragglers the job named.

The numbers come from :func:`ringlet.bench.overlap.analyze` (re-exported here with its helpers); this
command prints them as a table or as JSON. The stragglers are the ``straggler`` / ``straggler_recovered``
instants that :mod:`ringlet.straggler` marks on the timeline (one per rank that wrote the trace: the
lowest rank's are listed).
"""
from __future__ import annotations

import json
from dataclasses import asdict

import click

from ..bench.overlap import Report, analyze, intersect, measure, summarize, union
from ..timeline import read_events


def _ms(us: float) -> str:
    return f"{us / 1000.0:10.3f}"


def format_report(rep: Report) -> str:
    """The table ``ringlet report`` prints."""
    head = f"{'step':>5} {'step ms':>10} {'compute ms':>10} {'comm ms':>10} {'hidden ms':>10} {'exposed ms':>10} " \
           f"{'exposed %':>9}"
    lines = [f"{rep.path} (rank {rep.rank}): {len(rep.steps)} steps", head]
    for s in rep.steps:
        lines.append(f"{s.index:5d} {_ms(s.step_us)} {_ms(s.compute_us)} {_ms(s.comm_us)} {_ms(s.hidden_us)} "
                     f"{_ms(s.exposed_us)} {100 * s.exposed_share:8.1f}%")
    m = rep.summary
    lines.append(f"{'mean':>5} {_ms(m.step_us)} {_ms(m.compute_us)} {_ms(m.comm_us)} {_ms(m.hidden_us)} "
                 f"{_ms(m.exposed_us)} {100 * m.exposed_share:8.1f}%   (over {m.steps} steps)")
    lines.append(f"communication hidden behind compute: {100 * m.hidden_fraction:.1f}%; "
                 f"exposed communication: {100 * m.exposed_share:.1f}% of the step")
    return "\n".join(lines)


STRAGGLER_TRACK_EVENTS = ("straggler", "straggler_recovered")


def stragglers(events: list[dict]) -> list[dict]:
    """The straggler verdicts of a timeline's events, in time order: each the event's arguments (rank,
    host, kind, state, value, median, ranks, links) with ``ts_us``; from the lowest rank that marked any."""
    marked = [e for e in events if e.get("name") in STRAGGLER_TRACK_EVENTS and e.get("ph") in ("i", "I")
              and isinstance(e.get("args"), dict)]
    if not marked:
        return []
    first = min(e.get("pid", 0) for e in marked)
    return [dict(e["args"], ts_us=float(e["ts"])) for e in sorted(marked, key=lambda e: e["ts"])
            if e.get("pid", 0) == first]


def format_stragglers(found: list[dict]) -> str:
    """One line per verdict (``ringlet report``'s section after the table)."""
    if not found:
        return "stragglers: none named"
    lines = ["stragglers:"]
    for v in found:
        at = f"{v['ts_us'] / 1e6:10.3f} s"
        who = f"rank {v['rank']} (host {v['host']})" if v["kind"] == "compute" else \
            f"host {v['host']} (ranks {', '.join(map(str, v.get('ranks') or [v['rank']]))})"
        if v["state"] != "straggler":
            lines.append(f"  {at}  {who} recovered ({v['kind']}-bound before)")
        elif v["kind"] == "compute":
            lines.append(f"  {at}  {who} compute-bound: {v['value']:.3f} s per step against the others' "
                         f"median {v['median']:.3f} s")
        else:
            links = ", ".join(f"{a}->{b}" for a, b in v.get("links") or [])
            lines.append(f"  {at}  {who} network-bound: senders blocked {100 * v['value']:.1f}% on {links} "
                         f"against the median {100 * v['median']:.1f}%")
    return "\n".join(lines)


@click.command("report")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option("--rank", type=int, default=None, help="Rank whose events to analyse (default: the lowest).")
@click.option("--skip", type=int, default=1, show_default=True, help="Warm-up steps left out of the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON instead of a table.")
def report_cli(trace: str, rank: int | None, skip: int, as_json: bool) -> None:
    """Per-step compute, communication, hidden and exposed communication of a ringlet timeline."""
    try:
        rep = analyze(trace, rank=rank, skip=skip)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if not rep.steps:
        raise click.ClickException(f"{trace}: no BACKWARD/FORWARD/COMMUNICATE spans or step marks found")
    found = stragglers(read_events(trace))
    if as_json:
        click.echo(json.dumps(dict(asdict(rep), stragglers=found), indent=1))
    else:
        click.echo(format_report(rep) + "\n" + format_stragglers(found))


__all__ = ["analyze", "format_report", "format_stragglers", "intersect", "measure", "report_cli", "stragglers",
           "summarize", "union"]
