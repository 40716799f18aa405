"""Command lines: ``harmony-master``, ``harmony-worker`` and ``harmony``.

One module per family of commands: :mod:`~harmony.cli.daemons` (the master
and worker daemons), :mod:`~harmony.cli.jobs` (submit, jobs, status, model,
cancel, pause, resize, resume), :mod:`~harmony.cli.cluster` (cluster,
demo), :mod:`~harmony.cli.observe` (dashboard, logs, report),
:mod:`~harmony.cli.data` (data, keys); :mod:`~harmony.cli.dispatch` has
``harmony``'s parser and runs the command; :mod:`~harmony.cli.common` what
they share. The console scripts are ``harmony.cli:main``,
``harmony.cli:master_main`` and ``harmony.cli:worker_main``.
"""
from harmony.cli.daemons import master_main, worker_main
from harmony.cli.dispatch import main

__all__ = ["main", "master_main", "worker_main"]
