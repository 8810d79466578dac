"""Deprecated since 0.2.0: moved to harness.runtime.ranks (harness/moved.py, CHANGELOG.md)."""
from harness.moved import alias

alias(__name__)
