"""The construction-time choices of :class:`~ringlet.torch.training.ddp.DistributedDataParallel`."""
from __future__ import annotations

from dataclasses import dataclass

from ringlet import compression as _compression

from .adapt import Adapt
from .priority import Priority

__all__ = ["DDPOptions"]


@dataclass(frozen=True, slots=True)
class DDPOptions:
    """Bucketing and reduction choices, fixed at construction.

    ``first_bucket_cap_mb`` defaults to ``min(1, bucket_cap_mb)``: a small first bucket (the last layers)
    starts communication early in backward, as torch does. ``compression``: the
    :class:`ringlet.compression.Compressor` the dense buckets travel with, None for none. ``priority``: the
    :class:`~ringlet.torch.training.priority.Priority` strategy, None for first-in-first-out launches.
    ``adapt``: the :class:`~ringlet.torch.training.adapt.Adapt` strategy of dynamic adjustment, None for none.
    """

    bucket_cap_mb: float = 25.0
    first_bucket_cap_mb: float = 1.0
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    algorithm: str = "auto"
    tune: bool = True
    gradient_as_bucket_view: bool = False
    sufficient_factors: str = "auto"  # "off", "on" (where the factors are smaller) or "auto" (... and faster)
    compression: _compression.Compressor | None = None
    priority: Priority | None = None
    adapt: Adapt | None = None

    @classmethod
    def parse(cls, bucket_cap_mb: float, first_bucket_cap_mb: float | None, sufficient_factors: bool | str,
              compression=None, priority: Priority | None = None, **flags) -> DDPOptions:
        """Options from the constructor's arguments; ``flags``: the other fields. Raises ``ValueError`` for
        a cap that is not positive, a ``sufficient_factors`` other than True, False or ``"auto"`` or a
        compressor name :func:`ringlet.compression.get` does not know (``TypeError`` for a
        ``compression`` that is neither a name nor a compressor, a ``priority`` that is not a
        :class:`~ringlet.torch.training.priority.Priority` or an ``adapt`` that is not an
        :class:`~ringlet.torch.training.adapt.Adapt`)."""
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        first = min(1.0, bucket_cap_mb) if first_bucket_cap_mb is None else first_bucket_cap_mb
        factors = {True: "on", False: "off"}.get(sufficient_factors, sufficient_factors)
        if factors not in ("on", "off", "auto"):
            raise ValueError(f"sufficient_factors must be True, False or 'auto', got {sufficient_factors!r}")
        comp = None if compression is None else _compression.get(compression)
        if priority is not None and not isinstance(priority, Priority):
            raise TypeError(f"priority must be a ringlet.torch.Priority or None, got {type(priority).__name__}")
        adapt = flags.pop("adapt", None)
        if adapt is not None and not isinstance(adapt, Adapt):
            raise TypeError(f"adapt must be a ringlet.torch.training.Adapt or None, got {type(adapt).__name__}")
        return cls(float(bucket_cap_mb), float(first), sufficient_factors=factors, compression=comp, priority=priority,
                   adapt=adapt, **{k: v if k == "algorithm" else bool(v) for k, v in flags.items()})
