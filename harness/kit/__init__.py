"""The engine kit: what every runtime that drives a real engine (vLLM's, LMDeploy's, the next one)
needs and none of them should write again. Each module is small and imports its engine nothing:

- `events`: one line per stage (build, capture, first step, failure) to a log and an events file;
- `guard`: what an engine changes for the whole process (environment, torch's generators) put back;
- `checks`: the config checks every one-GPU, one-backend runtime makes before a build;
- `delegate`: the protocol's policy questions answered by the runtime's policy object;
- `scheduled`: a base for an engine this runtime schedules one exact batch at a time;
- `block_book`: the scheduler's books (live requests, their tokens and KV blocks);
- `observer`: a step observer's record per step and its padded-row fills;
- `checkpoint`: the harness's checkpoint with a tokenizer, for an engine that loads one.

The one smoke driver is `python -m harness.smoke --runtime NAME`.
"""
