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


MiB = 1 << 20


def _feed(policy, frees, step=0.5):
    """Feed one sample every ``step`` seconds; the sample indices at which the policy trims."""
    return [i for i, free in enumerate(frees) if policy.observe(i * step, free)]


def test_memory_that_stays_free_is_trimmed_once_per_interval():
    # interval 10 s, a sample every 0.5 s: 20 samples an interval
    assert _feed(memory.DecayPolicy(10.0), [64 * MiB] * 61) == [20, 40, 60]


def test_a_loop_that_takes_its_memory_back_every_step_is_never_trimmed():
    frees = [(64 * MiB if i % 3 else 0) for i in range(200)]
    assert _feed(memory.DecayPolicy(10.0), frees) == []


def test_less_than_the_floor_is_never_trimmed():
    assert _feed(memory.DecayPolicy(10.0, floor=4 * MiB), [3 * MiB] * 100) == []


def test_the_trim_waits_for_a_moment_near_the_low_point():
    # low point 8 MiB early in the interval; at its end 40 MiB are free (a step's activations): no trim
    # then, but at the next sample near 8 MiB
    frees = [8 * MiB] + [40 * MiB] * 24 + [9 * MiB] + [40 * MiB] * 5
    assert _feed(memory.DecayPolicy(10.0), frees) == [25]


def test_a_due_trim_lapses_after_an_interval_without_a_low_moment():
    frees = [8 * MiB] + [40 * MiB] * 60
    assert _feed(memory.DecayPolicy(10.0), frees) == [60]  # lapsed at 40; the next interval (low 40 MiB) trims at its end


def test_without_heap_statistics_every_interval_ends_with_a_trim():
    assert _feed(memory.DecayPolicy(10.0), [None] * 41) == [20, 40]


def test_thread_trims_until_stopped():
    calls = []
    decay = memory.HeapDecay(0.01, trim=calls.append, free_bytes=lambda: 64 * MiB)
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


def test_free_heap_is_read_from_glibc():
    free = memory._free_heap()
    if memory._malloc_trim() is None or free is None:
        pytest.skip("glibc's mallinfo2 is not available")
    assert free() >= 0


def test_init_runs_one_decay_thread_and_shutdown_ends_it(monkeypatch):
    monkeypatch.setenv("RINGLET_MALLOC_DECAY", "0.05")
    rt = ringlet.init()
    try:
        decay = rt.heap_decay
        if memory._malloc_trim() is None:
            assert decay is None
            return
        assert decay.interval == 0.05 and decay._thread.is_alive()
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
