"""``ringlet demo``: train on N local processes with ringlet and with torch's own DDP, side by side.

Prints each job's final test accuracy, training samples/s and the configuration it reported (ringlet's
transport and all-reduce algorithm; torch.distributed's backend), then the all-reduce demo's busbw
table. The engine is :mod:`ringlet.bench.demo`; exit status 1 when a job failed or a result was wrong.
"""
from __future__ import annotations

import sys

import click

from ..bench.demo import TRAINERS, JobResult, TrainResult, allreduce_demo, find_examples, train_all
from ..launch import TRANSPORTS, default_transport


def _failure(what: str, job: JobResult) -> str:
    return (f"{what} failed (exit status {job.returncode}).\n--- stdout (tail) ---\n{job.stdout[-2000:]}"
            f"\n--- stderr (tail) ---\n{job.stderr[-4000:]}")


def _table(rows: list[TrainResult]) -> None:
    base = next((r.rate for r in rows if r.trainer.stock), None)
    click.echo(f"\n{'':<40}{'test accuracy':>14}{'samples/s':>12}{'vs torch DDP':>14}")
    for r in rows:
        ratio = f"{r.rate / base:.2f}x" if base else "-"
        click.echo(f"{r.trainer.label:<40}{r.accuracy:>14.4f}{r.rate:>12.1f}{ratio:>14}")
    click.echo("samples/s: training samples of all processes per second of training (start-up and "
               "evaluation excluded)")
    click.echo("configurations:")
    for r in rows:
        click.echo(f"  {r.trainer.label}: {r.configuration}")
    click.echo("")


def run_demo(np_: int = 4, epochs: int = 5, batch_size: int = 32, transport: str | None = None,
             allreduce: bool = True, examples: str | None = None, timeout: float = 600.0) -> int:
    """Run the comparison (and the all-reduce demo); print the tables; return the exit status."""
    root = find_examples(examples)
    how = transport or f"{default_transport()}, ringlet run's default on this host"
    click.echo(f"ringlet demo: an MLP on scikit-learn's digits, {np_} processes on this machine, {epochs} epochs, "
               f"batch {batch_size} per process (ringlet's transport: {how}; torch's DDP on Gloo)")

    def started(label: str) -> None:
        click.echo(f"  training with {label} ...", nl=False)

    def finished(label: str, job: JobResult, ok: bool) -> None:
        click.echo(f" {job.seconds:.1f} s" if ok else " FAILED")
        if not ok:
            click.echo(_failure(label, job), err=True)

    rows = train_all(root, np_, epochs, batch_size, transport, timeout, started, finished)
    failed = len(TRAINERS) - len(rows)
    if rows:
        _table(rows)
    if allreduce:
        job = allreduce_demo(root, np_, transport, timeout)
        click.echo(job.stdout, nl=False)
        if job.returncode != 0:
            click.echo(_failure("the all-reduce demo", job), err=True)
            failed += 1
    return 1 if failed else 0


@click.command("demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-np", "--np", "np_", type=int, default=4, show_default=True, help="Local processes per job.")
@click.option("--epochs", type=int, default=5, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True, help="Per process.")
@click.option("--transport", type=click.Choice(TRANSPORTS), default=None,
              help="ringlet's transport (default: ringlet run's, shm on one host); torch's DDP always runs on Gloo.")
@click.option("--allreduce/--no-allreduce", default=True, show_default=True, help="Also run the all-reduce demo.")
@click.option("--examples", default=None, help="Directory of the example scripts (default: the source tree's).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds per job before it is stopped.")
def demo_cli(np_, epochs, batch_size, transport, allreduce, examples, timeout):
    """Train on local processes with ringlet and with torch's DDP; print accuracy and samples/s side by side."""
    if np_ < 1 or epochs < 1 or batch_size < 1:
        raise click.BadParameter("-np, --epochs and --batch-size must be positive")
    try:
        sys.exit(run_demo(np_, epochs, batch_size, transport, allreduce, examples, timeout))
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
