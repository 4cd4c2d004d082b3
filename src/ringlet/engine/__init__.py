"""The one engine under every front end: flat-buffer collectives over a group, run by the one executor.

The core API (:mod:`ringlet.collectives`), the Horovod coordinator, DDP, the comm hooks and the
sufficient-factors path all reach the network through the operations of this package.

Below it: the schedules and the executor (:mod:`ringlet.algorithms`) and the transports. It does not
import the tuning package: whoever builds a :class:`~ringlet.engine.channel.Channel` (the runtime)
hands it the algorithm selector. A core all-reduce runs :func:`ringlet.engine.ops.allreduce_op_`: the
transport's one small-message path (:mod:`.small`, the check in band) where it takes the message, else
the metadata agreed (:mod:`.agree`), the algorithm selected, its schedule executed.
"""
