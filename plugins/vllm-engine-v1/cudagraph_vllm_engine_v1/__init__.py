"""vLLM 0.25's own engine with its V1 model runner (GPUModelRunner, CudagraphDispatcher), one GPU, as a
cudagraph-conformance runtime. The build, settings and release rules are the V2 runtime's
(cudagraph_vllm_engine); this package holds what the V1 runner does differently."""
__version__ = "0.1.0"
