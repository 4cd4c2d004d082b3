"""The read-only properties of :class:`~ringlet.torch.training.ddp.DistributedDataParallel` (for inspection,
tests and reports): the algorithm and buckets in use, the factored weights, the compressor states, the
buffers replaced, dynamic adjustment's corrector and switches. A mixin over the DDP's private state."""
from __future__ import annotations

from ringlet import collectives as _core
from ringlet.tuning.adaptive import Adaptive

from .adapt import Applied
from .compressed_reduction import CompressedReduction

__all__ = ["ReadOuts"]


class ReadOuts:
    """Mixed into :class:`~ringlet.torch.training.ddp.DistributedDataParallel`."""

    @property
    def algorithm(self) -> str:
        """The all-reduce algorithm the buckets use now (during tuning: the one on trial); ``auto``
        under ``RINGLET_ALGORITHM`` reports the algorithm that variable forces."""
        return _core.resolve_algorithm(self._bucket_algorithm(), _core.runtime())

    @property
    def choices(self) -> dict[str, str]:
        """What each dense all-reduce of a step runs now (``bucketK`` or ``pieceK`` -> algorithm, with the
        segment size where dynamic adjustment knows it from the installed model; see
        :mod:`~ringlet.torch.training.adapt`). For logs and benchmarks."""
        messages = self._launch.messages(self._sets.active)
        algorithm = self._bucket_algorithm()
        if self._adjust is None:
            return {k: _core.resolve_algorithm(algorithm, _core.runtime()) for k in messages}
        return {k: self._adjust.ran(algorithm, n).describe() for k, n in messages.items()}

    @property
    def bucket_cap_bytes(self) -> int:
        """The bucket cap in use (``bucket_cap_mb`` until dynamic adjustment changes it); the first bucket
        keeps ``first_bucket_cap_mb``."""
        return self._plan.cap_bytes

    @property
    def bucket_layout(self) -> list[list[str]]:
        """Parameter names per bucket, in launch order (for inspection and tests)."""
        return [[self._names.get(id(p), "?") for p in b.params] for b in self._buckets]

    @property
    def factored(self) -> list[str]:
        """Names of the weights whose average is computed from gathered factors (empty until the second
        step: the first one reduces everything densely and measures the layers' row counts)."""
        return [self._names.get(id(b.params[0]), "?") for b in self._buckets if b.reduction.factored]

    @property
    def factored_reductions(self) -> int:
        """Weight averages computed from factors so far."""
        return self._ctx.factored

    @property
    def factor_fallbacks(self) -> int:
        """Factored weights all-reduced densely because some rank's factors did not match its gradient."""
        return self._ctx.fallbacks

    @property
    def compression_states(self) -> list[dict]:
        """The compressor state of every compressed bucket, of both bucket sets (error-feedback residuals
        live there: a loss scaler rescales them when its scale changes)."""
        sets = [s for s in (self._sets.dense, self._sets.factored) if s is not None]
        return [b.reduction.state for s in sets for b in s.buckets if isinstance(b.reduction, CompressedReduction)]

    @property
    def fresh_buffers(self) -> int:
        """Buckets replaced because something besides the lent ``.grad`` views still held their memory."""
        return self._ctx.fresh_buffers

    @property
    def adaptive(self) -> Adaptive | None:
        """The dynamic adjustment's corrector (its fitted constants, factors, bucket size), or None where it
        does not apply (see :mod:`~ringlet.torch.training.adapt`)."""
        return self._adjust.adaptive if self._adjust is not None else None

    @property
    def switches(self) -> list[Applied]:
        """The switches dynamic adjustment made so far (the same on every rank), in order."""
        return list(self._adjust.switches) if self._adjust is not None else []
