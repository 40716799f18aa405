"""Scheduling policies: pure functions of a cluster view to a decision."""
