"""The engine of ``ringlet demo``: train on N local processes with ringlet and with torch's own DDP.

Each training job is launched through ``ringlet run -np N`` with the training examples of the source
tree on scikit-learn's digits, with the same model, data, seed and epochs:

* ``examples/train_digits_hvd.py`` — ``ringlet.torch`` as Horovod (``DistributedOptimizer``),
* ``examples/train_digits_ddp.py`` — ``ringlet.torch.DistributedDataParallel``,
* ``examples/train_digits_ddp.py --stock`` — ``torch.nn.parallel.DistributedDataParallel`` on Gloo,

and yields each one's final test accuracy, training samples/s (measured inside the job, start-up
excluded) and the configuration the job reported on its ``configuration:`` line. ringlet's jobs run
on the transport asked for, else on ``ringlet run``'s default; torch's DDP runs on Gloo whatever the
transport. ``examples/demo_allreduce.py`` checks every all-reduce algorithm on integer data.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

_RESULT = re.compile(r"test accuracy: ([\d.]+)\s+throughput: ([\d.]+) samples/s")
_CONFIG = re.compile(r"^configuration: (.*)$", re.M)


@dataclass(frozen=True, slots=True)
class Trainer:
    """One training job of the comparison: a label, an example script and its extra arguments."""

    label: str
    script: str
    args: tuple[str, ...] = ()
    stock: bool = False  # torch's DDP (Gloo from env://): launched over the torch transport if mpi was asked


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


@dataclass(frozen=True, slots=True)
class TrainResult:
    trainer: Trainer
    accuracy: float
    rate: float  # training samples of all processes per second
    configuration: str
    job: JobResult


def find_examples(explicit: str | None = None) -> Path:
    """The examples directory: ``explicit``, else the source tree's (this file is src/ringlet/bench/demo.py),
    else ./examples; ``FileNotFoundError`` naming the places looked at."""
    candidates = [Path(explicit)] if explicit else [Path(__file__).resolve().parents[3] / "examples",
                                                     Path.cwd() / "examples"]
    for c in candidates:
        if (c / "demo_allreduce.py").is_file():
            return c
    raise FileNotFoundError(
        "ringlet demo runs the scripts in the repository's examples/ directory, which was not found "
        f"(looked in {', '.join(map(str, candidates))}). Run it from a source checkout or pass --examples DIR.")


def launch(np_: int, transport: str | None, argv: list[str], timeout: float) -> JobResult:
    """``ringlet run -np NP [--transport T] -- python ARGV``; stopped (SIGTERM, then SIGKILL) after ``timeout``."""
    cmd = [sys.executable, "-m", "ringlet.cli.main", "run", "-np", str(np_),
           *(("--transport", transport) if transport else ()), "--", sys.executable, *argv]
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


def train(trainer: Trainer, root: Path, np_: int, epochs: int, batch_size: int, transport: str | None,
          timeout: float) -> tuple[TrainResult | None, JobResult]:
    """Run one training job; its result, or None when it failed or printed no result line."""
    if trainer.stock and transport == "mpi":
        transport = "torch"  # torch's DDP needs torchrun's env:// variables, which mpiexec does not set
    argv = [str(root / trainer.script), "--epochs", str(epochs), "--batch-size", str(batch_size), *trainer.args]
    job = launch(np_, transport, argv, timeout)
    m = _RESULT.search(job.stdout)
    if job.returncode != 0 or m is None:
        return None, job
    c = _CONFIG.search(job.stdout)
    return TrainResult(trainer, float(m.group(1)), float(m.group(2)), c.group(1) if c else "?", job), job


def train_all(root: Path, np_: int, epochs: int, batch_size: int, transport: str | None, timeout: float,
              started: Callable[[str], None], finished: Callable[[str, JobResult, bool], None]) -> list[TrainResult]:
    """Every job of :data:`TRAINERS` in turn; ``started(label)`` and ``finished(label, job, ok)`` report
    progress. Returns the results of the jobs that succeeded."""
    rows = []
    for t in TRAINERS:
        started(t.label)
        res, job = train(t, root, np_, epochs, batch_size, transport, timeout)
        finished(t.label, job, res is not None)
        if res is not None:
            rows.append(res)
    return rows


def allreduce_demo(root: Path, np_: int, transport: str | None, timeout: float) -> JobResult:
    """``examples/demo_allreduce.py`` on ``np_`` ranks: every all-reduce algorithm checked, busbw table."""
    return launch(np_, transport, [str(root / "demo_allreduce.py")], timeout)
