from harness.moved import module_moved  # 0.4.0's path of plugins/vllm-engine-v1's module, until 0.6.0
module_moved(__name__, "cudagraph_vllm_engine_v1.lora", since="0.5.0")
