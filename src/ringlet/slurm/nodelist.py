"""Slurm's compact host lists and task counts, expanded without ``scontrol``.

Host lists (``SLURM_JOB_NODELIST``, ``SLURM_STEP_NODELIST``)::

    node[01-03,07],gpu-a[1-2]     -> node01 node02 node03 node07 gpu-a1 gpu-a2
    rack[1-2]-n[1-2]              -> rack1-n1 rack1-n2 rack2-n1 rack2-n2   (groups multiply, left first)
    login,node7                   -> login node7

Top-level commas separate entries; a bracket group holds comma-separated numbers or ranges ``a-b``
(``a <= b``), zero-padded to the width of ``a`` when ``a`` has leading zeros (``08-11`` -> 08 09 10 11).
Task counts (``SLURM_STEP_TASKS_PER_NODE``, ``SLURM_TASKS_PER_NODE``): ``2(x3),1`` -> ``[2, 2, 2, 1]``.

Anything else (unbalanced or nested brackets, an empty entry or group, a reversed range, letters in a
range) raises :class:`NodeListError` naming the text and the reason. Standard library only: the
launcher uses it before torch is imported.
"""
from __future__ import annotations

import re

MAX_NODES = 1 << 20  # expansions beyond this are refused (a typo such as node[1-99999999])


class NodeListError(ValueError):
    """A host list or a task-count list that does not parse."""


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets; brackets must balance and never nest."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise NodeListError(f"host list {text!r}: nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise NodeListError(f"host list {text!r}: ']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise NodeListError(f"host list {text!r}: '[' is never closed")
    parts.append(text[start:])
    return parts


def _numbers(group: str, text: str) -> list[str]:
    """The names one bracket group stands for: ``01-03,7`` -> ``["01", "02", "03", "7"]``."""
    out: list[str] = []
    for item in group.split(","):
        item = item.strip()
        lo, dash, hi = item.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise NodeListError(f"host list {text!r}: [{group}] holds {item!r}, not a number or a range a-b")
        if not dash:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise NodeListError(f"host list {text!r}: range {item!r} runs backwards")
        if b - a + 1 > MAX_NODES:
            raise NodeListError(f"host list {text!r}: range {item!r} has more than {MAX_NODES} names")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


_PIECE = re.compile(r"\[([^\]]*)\]")


def _expand_entry(entry: str, text: str) -> list[str]:
    names = [""]
    pos = 0
    for m in _PIECE.finditer(entry):
        if not m.group(1).strip():
            raise NodeListError(f"host list {text!r}: empty brackets in {entry!r}")
        names = [n + entry[pos:m.start()] for n in names]
        names = [n + x for n in names for x in _numbers(m.group(1), text)]
        if len(names) > MAX_NODES:
            raise NodeListError(f"host list {text!r}: more than {MAX_NODES} names")
        pos = m.end()
    names = [n + entry[pos:] for n in names]
    for n in names:
        if not n or any(c.isspace() for c in n) or "[" in n or "]" in n:
            raise NodeListError(f"host list {text!r}: {n!r} is not a host name")
    return names


def expand_nodelist(text: str) -> list[str]:
    """The host names of Slurm's compact list ``text``, in order (see the module docstring)."""
    if text is None or not text.strip():
        raise NodeListError("host list is empty")
    text = text.strip()
    out: list[str] = []
    for entry in _split_top(text):
        entry = entry.strip()
        if not entry:
            raise NodeListError(f"host list {text!r}: an empty entry (two commas in a row, or one at an end)")
        out.extend(_expand_entry(entry, text))
        if len(out) > MAX_NODES:
            raise NodeListError(f"host list {text!r}: more than {MAX_NODES} names")
    return out


_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_counts(text: str) -> list[int]:
    """Slurm's per-node task counts: ``2(x3),1`` -> ``[2, 2, 2, 1]``; every count at least 1."""
    if text is None or not text.strip():
        raise NodeListError("task count list is empty")
    out: list[int] = []
    for item in text.strip().split(","):
        m = _COUNT.match(item.strip())
        if not m:
            raise NodeListError(f"task count list {text!r}: {item!r} is not N or N(xM)")
        n, times = int(m.group(1)), int(m.group(2) or 1)
        if n < 1 or times < 1:
            raise NodeListError(f"task count list {text!r}: {item!r} counts zero")
        if len(out) + times > MAX_NODES:
            raise NodeListError(f"task count list {text!r}: more than {MAX_NODES} nodes")
        out.extend([n] * times)
    return out
