"""When a rank counts as a straggler: the environment's thresholds, checked once."""
from __future__ import annotations

import os
from dataclasses import dataclass


def _env(env, name: str, default: str) -> str:
    v = env.get(name)
    return default if v is None or not v.strip() else v.strip()


def _number(env, name: str, default: str, kind=float):
    raw = _env(env, name, default)
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a{'n integer' if kind is int else ' number'}") from None


@dataclass(frozen=True)
class StragglerOptions:
    """``enabled``: ``RINGLET_STRAGGLER`` (default 1; 0 turns the meter and the detector off).
    ``threshold``: a rank whose compute time exceeds the median of the others' by more than this
    fraction is slow (``RINGLET_STRAGGLER_THRESHOLD``, default 0.3: a CPU quota's throttling and a shared
    machine's scheduling move equal ranks' compute by 20% for seconds at a time). ``window`` and ``window_s``: each
    rank's numbers are trimmed means over its last ``window`` steps (``RINGLET_STRAGGLER_WINDOW``, default
    10) or over the steps of the last ``window_s`` seconds when those are more
    (``RINGLET_STRAGGLER_WINDOW_S``, default 5). ``checks``: the evidence that names a straggler
    (a compute straggler's grows by one per check at ``1 + 3 * threshold`` times the others' median, more
    or less with its ratio; a slow link's by one per check) and the consecutive normal checks that clear
    one (``RINGLET_STRAGGLER_CHECKS``, default 3).
    ``every``: heartbeats between checks (``RINGLET_STRAGGLER_EVERY``, default 1).
    ``net_threshold``: a link is slow when the share of its sends' time its sender spends blocked is
    above ``1 + net_threshold`` times the other links' median share (``RINGLET_STRAGGLER_NET_THRESHOLD``,
    default 2.0) and above ``min_blocked_share`` (2%; a named host is cleared below half of
    it). ``min_steps``: steps in a rank's window before it is
    compared; ``min_excess``: seconds of compute a slow rank must exceed the others' median by (timer
    noise on very short steps is no straggler); ``link_min_bytes``: the smallest send that is timed."""

    enabled: bool = True
    threshold: float = 0.3
    window: int = 10
    window_s: float = 5.0
    checks: int = 3
    every: int = 1
    net_threshold: float = 2.0
    min_blocked_share: float = 0.02
    min_steps: int = 5
    min_excess: float = 0.002
    link_min_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        if self.threshold <= 0 or self.net_threshold <= 0:
            raise ValueError(f"straggler thresholds must be positive, got threshold={self.threshold}, "
                             f"net_threshold={self.net_threshold}")
        if self.window_s <= 0:
            raise ValueError(f"RINGLET_STRAGGLER_WINDOW_S must be positive, got {self.window_s}")
        if self.window < 1 or self.checks < 1 or self.every < 1 or self.min_steps < 1:
            raise ValueError(f"straggler window, checks, every and min_steps must be at least 1: {self}")
        if self.min_steps > self.window:
            raise ValueError(f"straggler min_steps ({self.min_steps}) exceeds the window ({self.window})")

    @classmethod
    def from_env(cls, environ=None) -> "StragglerOptions":
        env = os.environ if environ is None else environ
        flag = _env(env, "RINGLET_STRAGGLER", "1").lower()
        if flag not in ("0", "1", "off", "on", "false", "true"):
            raise ValueError(f"RINGLET_STRAGGLER={flag!r}: use 1 (on, the default) or 0 (off)")
        window = _number(env, "RINGLET_STRAGGLER_WINDOW", "10", int)
        return cls(enabled=flag in ("1", "on", "true"),
                   threshold=_number(env, "RINGLET_STRAGGLER_THRESHOLD", "0.3"),
                   window=window,
                   window_s=_number(env, "RINGLET_STRAGGLER_WINDOW_S", "5"),
                   checks=_number(env, "RINGLET_STRAGGLER_CHECKS", "3", int),
                   every=_number(env, "RINGLET_STRAGGLER_EVERY", "1", int),
                   net_threshold=_number(env, "RINGLET_STRAGGLER_NET_THRESHOLD", "2.0"),
                   min_steps=min(cls.min_steps, window))
