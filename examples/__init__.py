"""Example runtimes written against the protocol alone (see docs/authoring.md, section 13)."""
