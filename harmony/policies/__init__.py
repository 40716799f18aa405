"""Scheduling policies: pure functions (or objects) of a cluster view to a
decision, called by the master core and, through it, by the simulator.

``view``: what a policy sees and answers; ``base``: the ``Policy``
protocol; ``registry``: the only list of policies by name; ``curves``:
loss curves and utilities. A policy never touches sockets, processes or
files, and nothing here imports the master, the simulator, ZeroMQ or LMDB.
"""
