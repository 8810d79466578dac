"""Deprecated since 0.4.0: moved to harness.supervisor (harness/moved.py, CHANGELOG.md)."""
from harness.moved import alias

alias(__name__)
