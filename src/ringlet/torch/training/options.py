"""The construction-time choices of :class:`~ringlet.torch.training.ddp.DistributedDataParallel`."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DDPOptions"]


@dataclass(frozen=True, slots=True)
class DDPOptions:
    """Bucketing and reduction choices, fixed at construction.

    ``first_bucket_cap_mb`` defaults to ``min(1, bucket_cap_mb)``: a small first bucket (the last layers)
    starts communication early in backward, as torch does.
    """

    bucket_cap_mb: float = 25.0
    first_bucket_cap_mb: float = 1.0
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    algorithm: str = "auto"
    tune: bool = True
    gradient_as_bucket_view: bool = False
    sufficient_factors: str = "auto"  # "off", "on" (where the factors are smaller) or "auto" (... and faster)

    @classmethod
    def parse(cls, bucket_cap_mb: float, first_bucket_cap_mb: float | None, sufficient_factors: bool | str,
              **flags) -> DDPOptions:
        """Options from the constructor's arguments; ``flags``: the other fields. Raises ``ValueError`` for
        a cap that is not positive or a ``sufficient_factors`` other than True, False or ``"auto"``."""
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        first = min(1.0, bucket_cap_mb) if first_bucket_cap_mb is None else first_bucket_cap_mb
        factors = {True: "on", False: "off"}.get(sufficient_factors, sufficient_factors)
        if factors not in ("on", "off", "auto"):
            raise ValueError(f"sufficient_factors must be True, False or 'auto', got {sufficient_factors!r}")
        return cls(float(bucket_cap_mb), float(first), sufficient_factors=factors,
                   **{k: v if k == "algorithm" else bool(v) for k, v in flags.items()})
