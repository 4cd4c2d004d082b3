"""The heap decay (ringlet.memory): its setting, its thread, and that a trim gives free heap back."""
import subprocess
import sys
import time

import pytest

import ringlet
from ringlet import memory


@pytest.mark.parametrize("raw,expected", [("", 10.0), ("0", 0.0), ("2.5", 2.5), (" 30 ", 30.0)])
def test_interval_from_environment(raw, expected):
    assert memory.decay_interval({"RINGLET_MALLOC_DECAY": raw}) == expected


@pytest.mark.parametrize("raw", ["soon", "-1", "nan", "inf"])
def test_bad_interval_names_the_variable(raw):
    with pytest.raises(ValueError, match="RINGLET_MALLOC_DECAY"):
        memory.decay_interval({"RINGLET_MALLOC_DECAY": raw})


def test_bad_interval_raises_at_init_before_anything_starts(monkeypatch):
    monkeypatch.setenv("RINGLET_MALLOC_DECAY", "often")
    with pytest.raises(ValueError, match="RINGLET_MALLOC_DECAY"):
        ringlet.init()
    assert not ringlet.is_initialized()


def test_thread_trims_until_stopped():
    calls = []
    decay = memory.HeapDecay(0.01, trim=calls.append)
    deadline = time.monotonic() + 5
    while decay.trims < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    decay.stop()
    decay.stop()
    assert decay.trims >= 3 and set(calls) == {0}
    assert not decay._thread.is_alive()
    done = decay.trims
    time.sleep(0.05)
    assert decay.trims == done


def test_zero_interval_starts_nothing():
    assert memory.start(0.0) is None
    with pytest.raises(ValueError):
        memory.HeapDecay(0.0, trim=lambda pad: 0)


def test_init_runs_one_decay_thread_and_shutdown_ends_it(monkeypatch):
    monkeypatch.setenv("RINGLET_MALLOC_DECAY", "0.05")
    rt = ringlet.init()
    try:
        decay = rt.heap_decay
        if memory._malloc_trim() is None:
            assert decay is None
            return
        deadline = time.monotonic() + 5
        while decay.trims < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert decay.trims >= 1
    finally:
        ringlet.shutdown()
    assert not decay._thread.is_alive()


_HOLES = """
import ctypes
from ringlet import memory

def rss_anon_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
libc.mallopt(-3, 64 << 20)   # M_MMAP_THRESHOLD: these blocks live in the heap, as under ringlet run
libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD: glibc does not trim by itself
trim = memory._malloc_trim()
blocks = [libc.malloc(256 << 10) for _ in range(64)]
for b in blocks:
    ctypes.memset(b, 1, 256 << 10)
for b in blocks[::2]:
    libc.free(b)  # 8 MiB of holes inside the heap
before = rss_anon_kib()
trim(0)
print(before - rss_anon_kib())
"""


@pytest.mark.skipif(memory._malloc_trim() is None, reason="glibc's malloc_trim is not available")
def test_a_trim_returns_the_holes_of_the_heap():
    # In a child: the thresholds set here are process-wide and would stay for the rest of the suite.
    out = subprocess.run([sys.executable, "-c", _HOLES], capture_output=True, text=True, timeout=60, check=True)
    assert int(out.stdout) >= 4 << 10  # KiB: at least half of the 8 MiB of holes came back
