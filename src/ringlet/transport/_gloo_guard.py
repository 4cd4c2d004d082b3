"""How the torch transport creates the Gloo groups it uses: on the job's interface, every pair
authenticated before first use, the listeners watched for strangers afterwards.

::

    with creating_gloo() as opened_before:
        pg = dist.new_group(...)            # binds per :mod:`._gloo_bind`
    secure_gloo(pg, opened_before, timeout)  # per :func:`pair_guard`'s strategy

:func:`pair_guard` picks the strategy from the job's secret (``RINGLET_JOB_SECRET``): with a secret,
:class:`PairAuth` runs :func:`._gloo_auth.authenticate_group` and hands the group's listeners to
:data:`._gloo_watch.watch`; without one (torchrun, tests), :class:`NoAuth` leaves the group as Gloo
made it, as before ringlet had secrets.
"""
from __future__ import annotations

import contextlib
import weakref

from ..security import job_secret
from ._gloo_auth import AuthResult, GroupView, authenticate_group
from ._gloo_bind import gloo_bound
from ._gloo_endpoints import LISTEN, Endpoint, own_connections, socket_inodes
from ._gloo_watch import watch

_secured: "weakref.WeakSet" = weakref.WeakSet()  # groups already authenticated in this process


def _dist():
    import torch.distributed as dist

    return dist


@contextlib.contextmanager
def creating_gloo():
    """Around the creation of a Gloo group: binds it (see :mod:`._gloo_bind`) and yields the socket
    inodes open before, which :func:`secure_gloo` uses to find the group's listeners."""
    before = set(socket_inodes())
    with gloo_bound():
        yield before


def new_listeners(before: set[int] | None) -> dict[int, Endpoint]:
    """Listening sockets this process opened since the snapshot ``before`` (inode -> endpoint)."""
    if before is None:
        return {}
    return {c.inode: c.local for c, _ in own_connections() if c.state == LISTEN and c.inode not in before}


def group_view(pg, listeners: dict[int, Endpoint]) -> GroupView | None:
    """The challenge's view of ``pg`` (a Gloo process group), or None when this rank is not a member,
    the group is not Gloo's or has one rank."""
    dist = _dist()
    if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
        return None
    if "gloo" not in str(dist.get_backend(pg)).lower():
        return None
    ranks = tuple(dist.get_process_group_ranks(pg))
    if len(ranks) < 2:
        return None
    return GroupView(pg, ranks, pg.rank(), sorted(set(listeners.values())))


class NoAuth:
    """The job has no secret: groups stay as Gloo made them."""

    def secure(self, pg, listeners: dict[int, Endpoint], timeout: float) -> None:
        return None


class PairAuth:
    """The job has a secret: every pair proves it, and the group's listeners are watched."""

    def __init__(self, secret: bytes):
        self._secret = secret

    def secure(self, pg, listeners: dict[int, Endpoint], timeout: float) -> AuthResult | None:
        view = group_view(pg, listeners)
        if view is None:
            return None
        result = authenticate_group(view, self._secret, timeout)
        if listeners and result.complete:
            watch.add(listeners, result.legit)
        return result


def pair_guard() -> NoAuth | PairAuth:
    """The strategy for this process's job (raises ``ValueError`` for a malformed secret)."""
    secret = job_secret()
    return PairAuth(secret) if secret is not None else NoAuth()


def secure_gloo(pg, before: set[int] | None, timeout: float) -> AuthResult | None:
    """Authenticate the Gloo group ``pg`` just created (``before``: from :func:`creating_gloo`; None
    for a group ringlet did not create, whose listeners are then not watched). Collective over the
    group's ranks; raises :class:`._gloo_auth.PairAuthError` when a pair fails. A group already
    authenticated is not challenged again."""
    if pg is None or pg in _secured:
        return None
    result = pair_guard().secure(pg, new_listeners(before), timeout)
    if result is not None:
        _secured.add(pg)
    return result
