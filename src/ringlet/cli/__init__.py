"""Command line: thin click commands that parse arguments, call a plain function and print.

``run`` → :func:`ringlet.launch.run`, ``bench`` → :mod:`ringlet.bench.job`, ``demo`` →
:mod:`ringlet.bench.demo`, ``report`` → :mod:`ringlet.bench.overlap`, ``cluster`` → :mod:`ringlet.cluster`;
``main.py`` registers them. Python code calls those functions directly, e.g.
``ringlet.launch.run(["python", "train.py"], np=4)``.
"""
