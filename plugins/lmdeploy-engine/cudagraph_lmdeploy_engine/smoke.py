"""The smoke stage of the GPU run: harness.smoke (the kit's one smoke driver) for LMDeploy, after
LMDeploy's environment is set (settings.apply_environment, before anything imports LMDeploy), with
what LMDeploy's graph runner decided at each step: decoding, its own graph-path answer, the key it
computed and replayed, and the padded rows' inputs.

    python -m cudagraph_lmdeploy_engine.smoke [--modes NONE,FULL_DECODE_ONLY,FULL_AND_PIECEWISE]
        [--presets small,tiny] [--live PATH]

Printed (SMOKE lines) and, with --live, appended as JSON lines. The first preset runs every mode;
the others only the first graph mode (a probe of whether LMDeploy's kernels run that shape).
Numbers are reported, not judged (the suites judge); the exit status is 0 when every engine built
and ran.
"""
from __future__ import annotations

import sys

from . import settings

MODES = ("NONE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
PRESETS = ("small", "tiny")
# Three prompts, decode steps of 3 (padded to 4), a mixed step, decode steps of 4, three prompts
# joining, then decode steps of 7 (padded to 8).
JOINS = {0: [(1, 5), (2, 11), (3, 3)], 3: [(4, 2)], 5: [(5, 4), (6, 1), (7, 6)]}
STEPS = 8


def step_details(engine, out) -> dict:
    """What LMDeploy's graph runner decided for the last step; `_` names go to the JSON line only."""
    record, inputs = engine.last, engine.last_step_inputs()
    pad = slice(out.num_real_tokens, out.num_padded_tokens)
    return {"decoding": record.decoding, "offered": record.offered, "declined": record.declined, "key": record.key,
            "_replayed_key": record.replayed_key, "_padded_token_ids": inputs.token_ids[pad].tolist(),
            "_padded_positions": inputs.positions[pad].tolist(), "_slot_mapping": inputs.slot_mapping.tolist()}


def main(argv=None) -> int:
    settings.apply_environment()  # before anything imports LMDeploy or the hub
    from harness import smoke

    return smoke.main(argv, runtime="cudagraph_lmdeploy_engine.runtime:LmdeployEngineRuntime", modes=MODES,
                      presets=PRESETS, description=__doc__.splitlines()[0], joins=JOINS, steps=STEPS,
                      step_details=step_details)


if __name__ == "__main__":
    sys.exit(main())
