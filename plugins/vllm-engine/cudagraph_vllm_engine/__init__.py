"""vLLM 0.25's own engine (V2 model runner, Triton attention, one GPU) as a cudagraph-conformance runtime."""
__version__ = "0.1.0"
