"""The launcher's engine: start N ranks of a command over a transport (what ``ringlet run`` does).

::

    from ringlet.launch import run
    status = run(["python", "train.py"], np=4)                  # shm on one host (the default there)
    status = run(["python", "train.py"], np=4, transport="mpi")
    status = run(["python", "train.py"], hosts="node1:4,node2:4")  # torch, one node launcher per host

- :mod:`.api`: :func:`run` (options, default transport, dispatch).
- :mod:`.agent`: torch/shm jobs under torch's elastic agent, one node launcher per host entry.
- :mod:`.store`: the job's TCPStore, listening on loopback for a single-host job.
- :mod:`.mpi`: mpi jobs under ``mpiexec``.
- :mod:`.elastic`: the supervisor of ``--elastic`` jobs.
- :mod:`.shim`: the per-rank wrapper (layout variables, signal forwarding, failure records).
- :mod:`.hosts`, :mod:`.env`, :mod:`.status`: host lists, the ranks' environment, how a job ends.

Every rank runs under :mod:`.shim`, which exports ``RINGLET_TRANSPORT``,
``RINGLET_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE`` and the ``HOROVOD_*`` equivalents,
forwards signals and records how its rank ended. Ranks also get ``OMP_NUM_THREADS=1`` and fixed glibc
malloc thresholds (:func:`.env.allocator_env`) unless the user set their own. When a rank fails, the
job is stopped and the launch returns the exit status of the rank that failed *first* (ranks that died
only because a peer died are not blamed). SIGINT/SIGTERM/SIGHUP are forwarded to the ranks.

``hosts`` (torch/shm): one node launcher per entry, in entry order, node rank = entry index. Entries
naming this machine (localhost, 127.x, its hostname) run as local subprocesses; the others start
through the remote shell ``rsh`` (default ``ssh``), called as ``RSH... HOST 'cd CWD && exec env
RINGLET_...=... PYTHON -m ringlet.cli.main run --node-rank I ...'``: the same Python path and working
directory must exist there, and only ``RINGLET_*`` and ``HOROVOD_*`` variables travel. Stopping the
job stops the rsh clients; with ssh use ``rsh="ssh -tt"`` so that the remote side sees the hangup.
Several entries on this machine act as separate hosts (each rank gets its entry's name as
``RINGLET_HOSTNAME``), which is how hierarchical algorithms run on one box; ``ringlet cluster``
(network namespaces as hosts) reuses this with an rsh that enters the namespace.
"""
from .api import default_transport, run
from .config import TRANSPORTS, LaunchError, RunConfig

__all__ = ["run", "default_transport", "RunConfig", "LaunchError", "TRANSPORTS"]
