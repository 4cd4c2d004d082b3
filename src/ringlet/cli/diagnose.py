"""``ringlet diagnose DIR``: why a job stopped, from every rank's flight record.

The records are the ``rank-<R>.json`` files :mod:`ringlet.flight` writes (``RINGLET_FLIGHT_DIR``); the
analysis is :mod:`ringlet.diagnose`. Prints the verdict in one sentence, then a table per rank.
Exit status 0 when nothing differs, 1 when the verdict names a problem, 2 on unreadable input.
"""
from __future__ import annotations

import json

import click

from ..diagnose import analyse, load


@click.command("diagnose")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the verdict and table as JSON.")
def diagnose_cli(directory: str, as_json: bool) -> None:
    """Read every rank's flight record in DIRECTORY and say which rank went wrong, and where."""
    try:
        dumps = load(directory)
    except ValueError as exc:
        err = click.ClickException(str(exc))
        err.exit_code = 2
        raise err from None
    v = analyse(dumps)
    if as_json:
        click.echo(json.dumps({"kind": v.kind, "verdict": v.sentence, "table": v.table}))
    else:
        click.echo(v.sentence)
        click.echo("")
        click.echo("\n".join(v.table))
    raise SystemExit(0 if v.kind == "consistent" else 1)
