"""Deprecated since 0.2.0: moved to harness.reports.plots (harness/moved.py, CHANGELOG.md)."""
from harness.moved import alias

alias(__name__)
