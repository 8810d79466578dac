"""0.4.0's path of cudagraph_vllm_engine_v1.smoke, until 0.6.0; `python -m` it still runs the new one."""
import sys
import warnings

from harness.moved import module_moved

if __name__ == "__main__":
    warnings.simplefilter("default", DeprecationWarning)  # shown, as in a script
    sys.exit(module_moved("cudagraph_vllm_engine.v1_smoke", "cudagraph_vllm_engine_v1.smoke", since="0.5.0").main())
module_moved(__name__, "cudagraph_vllm_engine_v1.smoke", since="0.5.0")
