"""Observability: the master's dashboard and Prometheus metrics, executor
logs from any machine, run reports, and the CLI's progress display.

Nothing here runs in the master's loop: the master publishes a snapshot (a
plain dict, :mod:`harmony.obs.snapshot`) at most once a second, and the
HTTP server (:mod:`harmony.obs.dashboard`) serves it from its own thread.
"""
