"""SGLang's own CUDA-graph policy as a cudagraph-conformance runtime (`--runtime sglang-policy`)."""
__version__ = "0.1.0"
