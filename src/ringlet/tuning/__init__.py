"""Numbers and decisions: which algorithm to use when. Framework-free; callers run the collectives."""
from .online import OnlineChoice

__all__ = ["OnlineChoice"]
