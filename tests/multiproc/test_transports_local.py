"""The torch and MPI transports in a world of one process (each test runs in a fresh interpreter, so
torch.distributed / MPI state never leaks into the pytest process)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> str:
    import os

    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.multiproc
def test_torch_transport_reuses_a_user_process_group():
    out = run_python("""
        import datetime, torch, torch.distributed as dist, ringlet
        from ringlet.launch.hosts import free_port
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        ringlet.init("torch")
        print(ringlet.size(), ringlet.allreduce(torch.ones(3), op="sum").tolist())
        ringlet.new_group([0])
        ringlet.shutdown()
        print("still initialized:", dist.is_initialized())
    """)
    assert "1 [1.0, 1.0, 1.0]" in out
    assert "still initialized: True" in out


@pytest.mark.multiproc
def test_torch_transport_from_env_needs_launcher_variables():
    out = run_python("""
        import os
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(k, None)
        from ringlet.transport.torchdist import TorchTransport
        try:
            TorchTransport.from_env()
        except RuntimeError as exc:
            print("error:", exc)
    """)
    assert "ringlet run" in out and "MASTER_ADDR" in out


@pytest.mark.multiproc
@pytest.mark.mpi
def test_mpi_transport_singleton():
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed")
    out = run_python("""
        import torch
        from ringlet.transport.mpi import MPITransport
        from ringlet.types import CollectiveTimeout
        t = MPITransport.from_env()
        a = torch.arange(10, dtype=torch.bfloat16)
        b = torch.zeros(10, dtype=torch.bfloat16)
        hr = t.irecv(b, 0, 5)
        t.isend(a, 0, 5).wait(10)
        hr.wait(10)
        print("bf16 roundtrip:", torch.equal(a, b), hr.done())
        print("native f16/f32:", t.native_allreduce(torch.ones(3, dtype=torch.float16), "sum", (0,)),
              t.native_allreduce(torch.ones(3), "max", (0,)))
        try:
            t.irecv(torch.zeros(2), 0, 9).wait(0.3)
        except CollectiveTimeout as exc:
            print("timeout:", exc)
        t.close()
    """)
    assert "bf16 roundtrip: True True" in out
    assert "native f16/f32: False True" in out
    assert "timeout: rank 0: receive with peer rank 0 (tag 9) timed out" in out
