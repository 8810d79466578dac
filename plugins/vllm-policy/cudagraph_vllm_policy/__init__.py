"""vLLM's own CUDA-graph policy as a cudagraph-conformance runtime (`--runtime vllm-policy`)."""
__version__ = "0.1.0"
