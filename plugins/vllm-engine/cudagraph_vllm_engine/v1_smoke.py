"""Moved to cudagraph_vllm_engine_v1.smoke (plugins/vllm-engine-v1) in 0.5.0."""
import sys
import warnings

from harness.moved import module_moved

if __name__ == "__main__":  # python -m cudagraph_vllm_engine.v1_smoke: the warning shown, as in a script
    warnings.simplefilter("default", DeprecationWarning)
    sys.exit(module_moved("cudagraph_vllm_engine.v1_smoke", "cudagraph_vllm_engine_v1.smoke", since="0.5.0").main())
module_moved(__name__, "cudagraph_vllm_engine_v1.smoke", since="0.5.0")
