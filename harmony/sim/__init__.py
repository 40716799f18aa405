"""Trace-driven simulation of a Harmony cluster on the master core (see engine.py)."""
