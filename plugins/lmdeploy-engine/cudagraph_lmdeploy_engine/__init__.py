"""LMDeploy 0.18's PyTorch engine (its model agent, cache engine and CUDA-graph runner, one GPU)
as a cudagraph-conformance runtime."""
__version__ = "0.1.0"
LMDEPLOY_VERSION = "0.18.0"  # the version whose code this package reads (policy.py) and drives (engine.py)
