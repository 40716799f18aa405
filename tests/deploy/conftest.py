"""Fixtures of the deploy/ tests (defined in deploytools.py)."""
from deploytools import aws, offline  # noqa: F401  (pytest fixtures)
