"""vLLM's own unit tests of its CUDA-graph policy, as data, run against the policy calculator
(docs/spec.md section 12). One JSON file per vLLM test file and release, under vllm-<release>/."""
