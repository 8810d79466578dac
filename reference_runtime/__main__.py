"""`python -m reference_runtime`: the policy calculator (reference_runtime/cli.py)."""
from reference_runtime import cli

raise SystemExit(cli.run())
