"""The ``ringlet`` console script: a click group whose subcommands are imported on first use.

A subcommand is registered as ``name -> "module:attribute"`` in :data:`COMMANDS`; its module is
imported only when the command runs (so ``ringlet run`` starts without importing benchmarks), and a
module that does not exist yet is simply not listed. To add ``bench``, ``demo``, ``cluster`` or
``simulate``: write ``ringlet/cli/<name>.py`` with a click command and add one line here.
"""
from __future__ import annotations

import importlib
import importlib.util

import click

COMMANDS: dict[str, str] = {
    "run": "ringlet.cli.run:run_cli",
    "bench": "ringlet.cli.bench:bench_cli",
    "demo": "ringlet.cli.demo:demo_cli",
    "cluster": "ringlet.cli.cluster:cluster_cli",
    "simulate": "ringlet.cli.simulate:simulate_cli",
    "report": "ringlet.cli.report:report_cli",
    "tune": "ringlet.cli.tune:tune_cli",
    "doctor": "ringlet.cli.doctor:doctor_cli",
    "diagnose": "ringlet.cli.diagnose:diagnose_cli",
}


def _load(target: str) -> click.Command | None:
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:  # not written yet; a broken import inside it still surfaces
            return None
        raise
    return getattr(mod, attr)


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        names = set(super().list_commands(ctx))
        names.update(n for n, target in COMMANDS.items() if importlib.util.find_spec(target.partition(":")[0]))
        return sorted(names)

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and name in COMMANDS:
            cmd = _load(COMMANDS[name])
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ringlet")
def main() -> None:
    """ringlet: gradient synchronisation for distributed PyTorch."""


if __name__ == "__main__":
    main()
