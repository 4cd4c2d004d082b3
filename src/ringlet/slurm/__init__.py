"""Slurm: ``srun python train.py`` forms the world with no other launcher, and ``ringlet run`` inside an
allocation places its node launchers with ``srun``. The contract is in ``docs/launching.md``.

- :mod:`.nodelist`: Slurm's compact host lists (``node[01-03,07]``) and task counts (``2(x3),1``).
- :mod:`.step`: detection of a multi-task step, validation of its variables, the rendezvous port.
- :mod:`.rendezvous`: what :func:`ringlet.init` does under a step (task 0 hosts ringlet's store).
- :mod:`.allocation`: the host list and remote shell of ``ringlet run`` inside ``salloc``/``sbatch``.
"""
from .nodelist import NodeListError, expand_counts, expand_nodelist
from .step import SlurmEnvError, SlurmStep, in_step, read_step, rendezvous_port

__all__ = ["NodeListError", "SlurmEnvError", "SlurmStep", "expand_counts", "expand_nodelist", "in_step",
           "read_step", "rendezvous_port"]
