"""Moved to cudagraph_vllm_engine_v1.ngram_stand_in (plugins/vllm-engine-v1) in 0.5.0."""
from harness.moved import module_moved

module_moved(__name__, "cudagraph_vllm_engine_v1.ngram_stand_in", since="0.5.0")
