"""Run by Python at the start of every rank of ``ringlet run`` (the launcher puts this folder first on
``PYTHONPATH``).

A script that calls ``torch.distributed.init_process_group()`` itself (``env://``) would connect to the
job's store with torch's ``TCPStore`` client, which cannot prove the job's secret. When the job has a
secret, this hook makes torch's ``env://`` rendezvous open ringlet's authenticated client instead, the
moment ``torch.distributed.rendezvous`` is imported (nothing is imported before). Then the
``sitecustomize`` this one shadows, if any, runs as it would have.
"""
import importlib.abc
import importlib.util
import os
import sys

_TARGET = "torch.distributed.rendezvous"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _patch(module) -> None:
    original = module._create_c10d_store

    def create(hostname, port, rank, world_size, timeout, *args, **kwargs):
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and os.environ.get("RINGLET_JOB_SECRET"):
            from ringlet.store.torch_store import connect

            return connect(hostname, int(port), timeout=timeout.total_seconds())
        return original(hostname, port, rank, world_size, timeout, *args, **kwargs)

    module._create_c10d_store = create


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of :data:`_TARGET` so that :func:`_patch` runs after it."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _chain() -> None:
    """Run the ``sitecustomize`` module that this one hides (the next one on ``sys.path``)."""
    for entry in sys.path:
        if os.path.abspath(entry or ".") == _HERE:
            continue
        path = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_ringlet_shadowed_sitecustomize", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if os.environ.get("RINGLET_JOB_SECRET") and _TARGET not in sys.modules:
    sys.meta_path.insert(0, _Finder())
_chain()
