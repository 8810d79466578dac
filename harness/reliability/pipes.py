"""Command-line tools end quietly when their reader goes away, as Unix tools do.

`scripts/time_breakdown.py | head -1` closes the pipe before the tool
has written everything: the next write raises BrokenPipeError, and Python would print a traceback
(and another when it flushes stdout at exit). A tool that ends here exits with 141 (128 + SIGPIPE),
the status a shell shows for `yes | head -1`, and prints nothing. Used by the report renderer, the
fidelity table and the scripts; the policy calculator, which imports nothing of the harness but its
protocol, does the same in `reference_runtime.cli.run`.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Callable

EXIT_STATUS = 128 + signal.SIGPIPE


def run(main: Callable[[], int | None]) -> int:
    """main()'s exit status, or EXIT_STATUS where its reader closed the pipe."""
    try:
        status = main()
        sys.stdout.flush()  # what is still buffered meets the closed pipe here, not at exit
    except BrokenPipeError:
        # Nothing more reaches the reader; point stdout at /dev/null so the interpreter's own flush
        # at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_STATUS
    return status or 0
