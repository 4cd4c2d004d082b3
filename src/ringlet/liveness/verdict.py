"""A verdict: which rank failed, on which host, how, and when it was noticed."""
from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass

from ..types import PeerError


@dataclass(frozen=True)
class Verdict:
    """``rank`` on ``host`` failed: ``reason`` says how (silent for N s, killed by a signal, exited
    with a status, or unreachable store); ``time`` is the wall-clock time it was noticed (seconds)."""

    rank: int
    host: str
    reason: str
    time: float
    kind: str = "silent"  # "silent", "dead" or "store"

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw) -> "Verdict":
        d = json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)
        return cls(int(d["rank"]), str(d["host"]), str(d["reason"]), float(d["time"]), str(d.get("kind", "silent")))

    def describe(self) -> str:
        if self.kind == "store":
            return f"the job's store at {self.host} {self.reason}"
        return f"rank {self.rank} (host {self.host}) {self.reason}"

    def error(self, here: int, cause: BaseException | None = None) -> PeerError:
        """The ``PeerError`` rank ``here`` raises for this verdict (``cause``: the transport's own error)."""
        tail = f" [{str(cause).splitlines()[0]}]" if cause is not None and str(cause) else ""
        rank = None if self.kind == "store" else self.rank
        return PeerError(f"rank {here}: {self.describe()}{tail}", rank=rank, host=self.host)


def exit_reason(status: int) -> str:
    """How a rank ended, from its shell-style exit status (128 + signal for a signal)."""
    if status > 128:
        try:
            return f"was killed by {signal.Signals(status - 128).name}"
        except ValueError:
            pass
    return f"exited with status {status}"
