"""Asynchronous ZeRO checkpoints: the file holds the snapshot while training goes on, a failed write keeps
the previous checkpoint and is reported (at ``wait()`` or, on every rank, at the next save), saves never
overlap, and the stalls are recorded."""
import errno
import threading

import pytest
import torch
from zero_ckpt_models import assert_state_dicts_equal, sharded

from ringlet.torch.training.zero import checkpoint as zckpt
from ringlet.torch.training.zero.checkpoint import AtomicWriter, CheckpointWriteError, SaveOptions

from conftest import run_world


class GatedWriter(AtomicWriter):
    """Holds every file's writing until ``gate`` is set."""

    def __init__(self):
        self.gate = threading.Event()

    def write(self, final, dump):
        assert self.gate.wait(30), "gate never opened"
        return super().write(final, dump)


class FailingWriter(AtomicWriter):
    """Writes half of the data file, then fails as a full disk would."""

    def stream(self, f, final):
        if not final.name.startswith("rank-") or not final.name.endswith(".pt"):
            return f

        class Half:
            def __init__(self):
                self.written = 0

            def write(self, b):
                if self.written > 100:
                    raise OSError(errno.ENOSPC, "No space left on device (injected)")
                self.written += len(b)
                return f.write(b)

            def flush(self):
                f.flush()
        return Half()


def assert_same_checkpoint(a, b):
    x, y = zckpt.consolidate(a), zckpt.consolidate(b)
    assert_state_dicts_equal(x["model"], y["model"])
    assert_state_dicts_equal(x["master"], y["master"])
    for name in x["optimizer"]["state"]:
        for k, v in x["optimizer"]["state"][name].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(y["optimizer"]["state"][name][k])), (name, k)
    assert x["extra"] == y["extra"]


@pytest.mark.parametrize("p", [1, 3])
def test_file_holds_the_snapshot_while_training_goes_on(p, tmp_path):
    def body(rank):
        net, zero = sharded(p, rank)
        extra = {"step": 3, "seen": [1, 2]}
        zckpt.save(tmp_path / "sync", zero, net, extra=extra)
        writer = GatedWriter()
        handle = zckpt.save_async(tmp_path / "async", zero, net, extra=extra, options=SaveOptions(writer=writer))
        assert handle.stall_seconds >= handle.snapshot_seconds > 0 and not handle.done()
        for step in range(3, 6):  # training modifies parameters, masters, optimizer state and buffers in place
            zero.step(step)
            with torch.no_grad():
                net.running.mul_(2)
        extra["seen"].append(3)
        assert not handle.done() and not zckpt.is_complete(tmp_path / "async")
        writer.gate.set()
        handle.wait()
        assert handle.done() and handle.write_seconds > 0 and handle.bytes_written > 0
    run_world(p, body)
    assert_same_checkpoint(tmp_path / "sync", tmp_path / "async")


def test_a_new_save_waits_for_the_previous_one(tmp_path):
    def body(rank):
        net, zero = sharded(2, rank)
        writer = GatedWriter()
        first = zckpt.save_async(tmp_path / "a", zero, net, options=SaveOptions(writer=writer))
        threading.Timer(0.2, writer.gate.set).start()
        second = zckpt.save_async(tmp_path / "b", zero, net)
        assert first.done()
        second.wait()
        return zckpt.load(tmp_path / "a", zero, net)
    run_world(2, body)
    assert zckpt.is_complete(tmp_path / "a") and zckpt.is_complete(tmp_path / "b")


@pytest.mark.parametrize("report_at_wait", [True, False])
def test_failed_write_keeps_previous_checkpoint(tmp_path, report_at_wait):
    def body(rank):
        net, zero = sharded(2, rank)
        zckpt.save(tmp_path / "step-1", zero, net, extra={"step": 1})
        writer = FailingWriter() if rank == 1 else AtomicWriter()
        handle = zckpt.save_async(tmp_path / "step-2", zero, net, extra={"step": 2}, options=SaveOptions(writer=writer))
        if report_at_wait:
            if rank == 1:
                with pytest.raises(OSError, match="injected"):
                    handle.wait()
            else:
                handle.wait()
            zckpt.save(tmp_path / "step-3", zero, net, extra={"step": 3})  # reported: the next save goes on
            return None
        with pytest.raises(CheckpointWriteError, match="failed on " + ("this" if rank == 1 else "another")) as info:
            zckpt.save(tmp_path / "step-3", zero, net)
        return type(info.value.__cause__)

    causes = run_world(2, body)
    assert causes == ([None, None] if report_at_wait else [type(None), OSError])
    assert not zckpt.is_complete(tmp_path / "step-2")
    assert not list((tmp_path / "step-2").glob(".*tmp")), "the failed write left its temporary file"
    assert zckpt.latest(tmp_path) == tmp_path / ("step-3" if report_at_wait else "step-1")
    net, zero = sharded(1, 0, seed=4, steps=0)
    assert zckpt.load(tmp_path / "step-1", zero, net) == {"step": 1}


def test_synchronous_failure_raises_on_every_rank(tmp_path):
    def body(rank):
        net, zero = sharded(3, rank)
        writer = FailingWriter() if rank == 2 else AtomicWriter()
        err = OSError if rank == 2 else CheckpointWriteError
        with pytest.raises(err):
            zckpt.save(tmp_path / "ck", zero, net, options=SaveOptions(writer=writer))
        zckpt.save(tmp_path / "ck2", zero, net)  # the ranks still agree afterwards
    run_world(3, body)
    assert not zckpt.is_complete(tmp_path / "ck") and zckpt.is_complete(tmp_path / "ck2")


def test_wait_timeout(tmp_path):
    net, zero = sharded(1, 0)
    writer = GatedWriter()
    handle = zckpt.save_async(tmp_path / "ck", zero, net, options=SaveOptions(writer=writer))
    with pytest.raises(TimeoutError, match="still writing"):
        handle.wait(0.05)
    writer.gate.set()
    handle.wait()
    assert zckpt.is_complete(tmp_path / "ck")


def test_load_waits_for_a_pending_save_of_the_same_optimizer(tmp_path):
    def body(rank):
        net, zero = sharded(2, rank)
        writer = GatedWriter()
        zckpt.save_async(tmp_path / "ck", zero, net, extra={"step": 3}, options=SaveOptions(writer=writer))
        threading.Timer(0.2, writer.gate.set).start()
        return zckpt.load(tmp_path / "ck", zero, net)
    assert run_world(2, body) == [{"step": 3}] * 2
