"""Elastic jobs: membership that changes while the job runs (``ringlet run --elastic``).

- :mod:`.protocol`: the keys the driver and the workers share in the driver's TCPStore.
- :mod:`.rendezvous`: the worker side; ``ringlet.init()`` (torch transport) joins the current
  *generation* through it instead of reading a fixed ``RANK``/``WORLD_SIZE``.
- :mod:`.release`: tears down an obsolete generation's TCP connections (Gloo itself does not release
  operations blocked on a departed peer).

The supervisor behind ``ringlet run --elastic`` (starts workers, decides every generation's
membership, replaces dead workers) is the launcher's: :mod:`ringlet.launch.elastic`.

The training-side API (Horovod's ``hvd.elastic``: ``run``, ``TorchState``, ``ElasticSampler``) is
:mod:`ringlet.torch.elastic`.
"""
