"""`python -m reference_runtime`: the policy calculator (reference_runtime/cli.py); quiet when its
reader closes the pipe (`... | head`), as Unix tools are."""
from harness.reliability import pipes
from reference_runtime import cli

raise SystemExit(pipes.run(cli.main))
