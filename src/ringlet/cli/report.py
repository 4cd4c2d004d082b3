"""``ringlet report trace.json``: how much communication hid behind compute, step by step.

The numbers come from :func:`ringlet.bench.overlap.analyze` (re-exported here with its helpers); this
command prints them as a table or as JSON.
"""
from __future__ import annotations

import json
from dataclasses import asdict

import click

from ..bench.overlap import Report, analyze, intersect, measure, summarize, union


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
    click.echo(json.dumps(asdict(rep), indent=1) if as_json else format_report(rep))


__all__ = ["analyze", "format_report", "intersect", "measure", "report_cli", "summarize", "union"]
