"""The executor's scratch memory: received segments that are reduced or copied later land here, in one
buffer per device kept in the caller's workspace between collectives. Schedules that keep data of
their own between steps (all-to-all's buffer 2) take another buffer of the same workspace, under
another key, so that the executor's never overlaps it."""
from __future__ import annotations

import torch


def scratch(workspace: dict | None, elems: int, like: torch.Tensor, key: str = "executor.scratch") -> torch.Tensor:
    """``elems`` elements of ``like``'s dtype: a view of the workspace's one byte buffer per device (kept
    at the largest size asked for, whatever the dtype), or a fresh tensor without a workspace. A kept
    buffer is written in full when it is made, so its memory is committed then, not page by page by the
    receives of later collectives (whose page faults would land inside them). ``key``: which of the
    workspace's buffers (one per key and device)."""
    if workspace is None:
        return torch.empty(elems, dtype=like.dtype, device=like.device)
    key = (key, like.device)
    nbytes = elems * like.element_size()
    buf = workspace.get(key)
    if buf is None or buf.numel() < nbytes:
        workspace.pop(key, None)  # the old buffer goes before the new one is committed
        buf = torch.zeros(nbytes, dtype=torch.uint8, device=like.device)
        workspace[key] = buf
    return buf[:nbytes].view(like.dtype)
