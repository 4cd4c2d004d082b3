"""The executor's scratch: one byte buffer per device in the caller's workspace, shared by every dtype and
kept at the largest size asked for (a soak of mixed dtypes otherwise retained one buffer per dtype)."""
from __future__ import annotations

import pytest
import torch

from ringlet.algorithms.scratch import scratch as _scratch

DTYPES = [torch.float64, torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64]


@pytest.mark.parametrize("elems", [0, 1, 7, 1031])
def test_one_buffer_serves_every_dtype(elems):
    ws: dict = {}
    for dt in DTYPES:
        s = _scratch(ws, elems, torch.empty(0, dtype=dt))
        assert s.dtype == dt and s.shape == (elems,) and s.is_contiguous()
        s.fill_(1)  # writable over its whole length
    assert len(ws) == 1
    (buf,) = ws.values()
    assert buf.dtype == torch.uint8 and buf.numel() == elems * 8  # the largest request: float64/int64


def test_grows_only_when_a_request_is_larger():
    ws: dict = {}
    a = _scratch(ws, 100, torch.empty(0, dtype=torch.float32))
    b = _scratch(ws, 50, torch.empty(0, dtype=torch.int64))  # 400 bytes: fits the 400 held
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    c = _scratch(ws, 51, torch.empty(0, dtype=torch.int64))  # 408 bytes: a new buffer
    assert next(iter(ws.values())).numel() == 408 and c.numel() == 51


def test_without_workspace_a_fresh_tensor():
    s = _scratch(None, 5, torch.empty(0, dtype=torch.bfloat16))
    assert s.dtype == torch.bfloat16 and s.numel() == 5


def test_a_kept_buffer_is_written_in_full_when_made():
    ws: dict = {}
    _scratch(ws, 1 << 16, torch.empty(0, dtype=torch.float32))
    (buf,) = ws.values()
    assert buf.numel() == 1 << 18 and int(buf.count_nonzero()) == 0  # zero-filled: every page committed
