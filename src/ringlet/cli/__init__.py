"""Command line: ``ringlet run`` (launcher) and the subcommands other modules register in ``main.py``.

Every command is a thin click wrapper over a plain function, so Python code can call
``ringlet.cli.run.run([...], np=4)`` directly.
"""
