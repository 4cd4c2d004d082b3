"""The one engine under every front end: flat-buffer collectives over a group, run by the one executor.

The core API (:mod:`ringlet.collectives`), the Horovod coordinator, DDP, the comm hooks and the
sufficient-factors path all reach the network through the operations of this package.
"""
