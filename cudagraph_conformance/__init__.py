"""Run the conformance suites from an installed wheel, from any directory.

    cudagraph-conformance --runtime myengine -n 2 --known-failures ci/known_failures.toml --report-dir out
    python -m cudagraph_conformance --runtime myengine            # the same

It is pytest underneath: every pytest option passes through, and the run, its test ids and its
report are those of `pytest suites/ --runtime myengine` in a checkout of this repository (see
`run.py`). The wheel carries the suites in `cudagraph_conformance/suites/`; in a checkout they are
the repository's `suites/`. Nothing here imports the harness before pytest starts, so pytest can
rewrite the plugin's asserts (PYTEST_DONT_REWRITE: this package is the launcher, not a plugin).
"""
