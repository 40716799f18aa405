"""Cruise (chapter 3): the pure parts of automatic PS configuration.

``costmodel``: the epoch cost of a configuration (Eqs 3.1-3.4) and moving-
average estimators of its inputs; ``optimizer``: Eq 3.5's closed form and a
HiGHS MILP over roles and block partitions; ``plan``: reconfiguration plans
(add / delete / switch / move DAGs), their scheduling and the 5% rule.
No sockets, files or processes: the master core and the simulator drive them.
"""
