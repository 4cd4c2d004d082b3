"""``ringlet demo``: train on N local processes with ringlet and with torch's own DDP, side by side.

One invocation launches, each through ``ringlet run -np N``, the training examples of the source tree on
scikit-learn's digits with the same model, data, seed and epochs:

* ``examples/train_digits_hvd.py`` — ``ringlet.torch`` as Horovod (``DistributedOptimizer``),
* ``examples/train_digits_ddp.py`` — ``ringlet.torch.DistributedDataParallel``,
* ``examples/train_digits_ddp.py --stock`` — ``torch.nn.parallel.DistributedDataParallel`` on Gloo,

and prints each one's final test accuracy and training samples/s (measured inside the job, start-up
excluded). Then ``examples/demo_allreduce.py`` checks every all-reduce algorithm on integer data and
prints its busbw table. Exit status 1 when a job failed or a result was wrong.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

_RESULT = re.compile(r"test accuracy: ([\d.]+)\s+throughput: ([\d.]+) samples/s")


@dataclass(frozen=True, slots=True)
class Trainer:
    """One training job of the comparison: a label, an example script and its extra arguments."""

    label: str
    script: str
    args: tuple[str, ...] = ()
    stock: bool = False  # torch's DDP: always launched over the torch transport (it needs env://)


TRAINERS = (
    Trainer("ringlet DistributedOptimizer (hvd API)", "train_digits_hvd.py"),
    Trainer("ringlet DistributedDataParallel", "train_digits_ddp.py"),
    Trainer("torch DistributedDataParallel (Gloo)", "train_digits_ddp.py", ("--stock",), stock=True),
)


@dataclass(frozen=True, slots=True)
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def find_examples(explicit: str | None = None) -> Path:
    """The examples directory: ``explicit``, else the source tree's (this file is src/ringlet/cli/demo.py),
    else ./examples."""
    candidates = [Path(explicit)] if explicit else [Path(__file__).resolve().parents[3] / "examples",
                                                     Path.cwd() / "examples"]
    for c in candidates:
        if (c / "demo_allreduce.py").is_file():
            return c
    raise click.ClickException(
        "ringlet demo runs the scripts in the repository's examples/ directory, which was not found "
        f"(looked in {', '.join(map(str, candidates))}). Run it from a source checkout or pass --examples DIR.")


def launch(np_: int, transport: str, argv: list[str], timeout: float) -> JobResult:
    """``ringlet run -np NP --transport T -- python ARGV``; stopped (SIGTERM, then SIGKILL) after ``timeout``."""
    cmd = [sys.executable, "-m", "ringlet.cli.main", "run", "-np", str(np_), "--transport", transport, "--",
           sys.executable, *argv]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # ringlet run forwards it to every rank
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        code, err = 124, f"{err}\nringlet demo: the job did not finish in {timeout:.0f} s and was stopped.\n"
    return JobResult(code, out, err, time.monotonic() - t0)


def _failure(what: str, job: JobResult) -> str:
    return (f"{what} failed (exit status {job.returncode}).\n--- stdout (tail) ---\n{job.stdout[-2000:]}"
            f"\n--- stderr (tail) ---\n{job.stderr[-4000:]}")


def run_demo(np_: int = 4, epochs: int = 5, batch_size: int = 32, transport: str = "torch",
             allreduce: bool = True, examples: str | None = None, timeout: float = 600.0) -> int:
    """Run the comparison (and the all-reduce demo); print the tables; return the exit status."""
    root = find_examples(examples)
    click.echo(f"ringlet demo: an MLP on scikit-learn's digits, {np_} processes on this machine, {epochs} epochs, "
               f"batch {batch_size} per process (ringlet over the {transport} transport)")
    rows, failed = [], 0
    for t in TRAINERS:
        click.echo(f"  training with {t.label} ...", nl=False)
        job = launch(np_, "torch" if t.stock else transport,
                     [str(root / t.script), "--epochs", str(epochs), "--batch-size", str(batch_size), *t.args],
                     timeout)
        m = _RESULT.search(job.stdout)
        if job.returncode != 0 or m is None:
            click.echo(" FAILED")
            click.echo(_failure(t.label, job), err=True)
            failed += 1
            continue
        click.echo(f" {job.seconds:.1f} s")
        rows.append((t, float(m.group(1)), float(m.group(2))))
    if rows:
        base = next((rate for t, _, rate in rows if t.stock), None)
        click.echo(f"\n{'':<40}{'test accuracy':>14}{'samples/s':>12}{'vs torch DDP':>14}")
        for t, acc, rate in rows:
            ratio = f"{rate / base:.2f}x" if base else "-"
            click.echo(f"{t.label:<40}{acc:>14.4f}{rate:>12.1f}{ratio:>14}")
        click.echo("samples/s: training samples of all processes per second of training (start-up and "
                   "evaluation excluded)\n")
    if allreduce:
        job = launch(np_, transport, [str(root / "demo_allreduce.py")], timeout)
        click.echo(job.stdout, nl=False)
        if job.returncode != 0:
            click.echo(_failure("the all-reduce demo", job), err=True)
            failed += 1
    return 1 if failed else 0


@click.command("demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-np", "--np", "np_", type=int, default=4, show_default=True, help="Local processes per job.")
@click.option("--epochs", type=int, default=5, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True, help="Per process.")
@click.option("--transport", type=click.Choice(("torch", "shm", "mpi")), default="torch", show_default=True,
              help="ringlet's transport (torch's DDP always runs on Gloo).")
@click.option("--allreduce/--no-allreduce", default=True, show_default=True, help="Also run the all-reduce demo.")
@click.option("--examples", default=None, help="Directory of the example scripts (default: the source tree's).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds per job before it is stopped.")
def demo_cli(np_, epochs, batch_size, transport, allreduce, examples, timeout):
    """Train on local processes with ringlet and with torch's DDP; print accuracy and samples/s side by side."""
    if np_ < 1 or epochs < 1 or batch_size < 1:
        raise click.BadParameter("-np, --epochs and --batch-size must be positive")
    sys.exit(run_demo(np_, epochs, batch_size, transport, allreduce, examples, timeout))
