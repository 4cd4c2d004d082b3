"""The remote shell of ``ringlet run`` inside a Slurm allocation: ``_srun_rsh.py NODE 'shell command'``
runs the command as a one-task step on NODE, as ``ssh NODE 'shell command'`` would run it there.

Started by path with only the standard library (once per node launcher). It replaces itself with::

    srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap --whole --kill-on-bad-exit=1 \\
         env -u RINGLET_HOSTNAME -u HOROVOD_HOSTNAME /bin/sh -c 'shell command'

``--whole`` gives the step every CPU the job holds on the node (the launcher starts its ranks there),
``--overlap`` lets it share them with other steps; the submitting shell's host names are dropped so that
the node launcher names its own host. ``RINGLET_SRUN`` replaces ``srun`` (a path, or a command with
options of its own).
"""
import os
import shlex
import sys


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        print("usage: _srun_rsh.py NODE 'shell command'", file=sys.stderr)
        sys.exit(255)
    node, command = argv
    srun = shlex.split(os.environ.get("RINGLET_SRUN", "").strip() or "srun")
    args = srun + ["--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap", "--whole", "--kill-on-bad-exit=1",
                   "env", "-u", "RINGLET_HOSTNAME", "-u", "HOROVOD_HOSTNAME", "/bin/sh", "-c", command]
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        print(f"ringlet run: cannot start {args[0]!r} to reach Slurm node {node}: {exc}", file=sys.stderr)
        sys.exit(255)


if __name__ == "__main__":
    main(sys.argv[1:])
