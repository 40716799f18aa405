"""Fixtures of the deploy/ tests (defined in deploytools.py)."""
from deploytools import aws  # noqa: F401  (a pytest fixture)
