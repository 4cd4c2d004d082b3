"""The one engine under every front end: flat-buffer collectives over a group, run by the one executor.

The core API (:mod:`ringlet.collectives`), the Horovod coordinator, DDP, the comm hooks and the
sufficient-factors path all reach the network through the operations of this package.

Below it: the schedules and the executor (:mod:`ringlet.algorithms`) and the transports. It does not
import the tuning package: whoever builds a :class:`~ringlet.engine.channel.Channel` (the runtime)
hands it the algorithm selector. The core API queues one request per call (:mod:`.requests`), which the
runtime runs with the op's channel. Every all-reduce enters at :func:`ringlet.engine.allreduce.allreduce_`,
the one entry that chooses the path (the transport's small-message path with the check in band, the
compressed all-reduce, or the metadata agreed and a selected schedule executed) and calls down into it.
"""
