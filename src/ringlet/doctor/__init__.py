"""``ringlet doctor``: a health check of a job's hosts, run as a job over the job's own transport.

* :mod:`.probe`: what one host measures alone (matrix-multiply GFLOP/s, free memory and cgroup limit,
  the MTU of the interface that carries the traffic); pure parsing helpers for ``/proc/meminfo`` and
  ``ip -o -4 addr``.
* :mod:`.job`: the in-job part (``python -m ringlet.doctor.job``): host pairs in rounds of disjoint pairs,
  ping-pong latency and clock offsets, one-way bandwidth, gathered on rank 0.
* :mod:`.verdict`: the table and the verdict, pure functions of the measured table.

A tool: it uses the library; the library never imports it.
"""
