"""vLLM 0.25's policy code without a GPU, so that `vllm-engine-policy` answers as `vllm-engine` does
(policy.py) anywhere vLLM 0.25 imports (scripts/vllm_versions_compare.py compares it with 0.33).

Without a GPU vLLM's platform has no device type, graphs or Triton driver. Two device queries of
the config code are answered as on the H200 the vllm-engine lane runs on, and nothing else:
the platform (device type "cuda", capability 9.0, name and memory, graphs supported, a placeholder
graph-pool handle), and Triton present (`vllm.config.vllm.HAS_TRITON`: without it VllmConfig
refuses the V2 model runner, which the engine runs).
"""
from __future__ import annotations

GiB = 1 << 30
DEVICE = ((9, 0), "NVIDIA H200", 139 * GiB)  # what torch reports on the lane's machine


def stand_in_for_an_h200() -> None:
    """Make vLLM's platform answer as an H200 and report Triton present (see the module docstring)."""
    import vllm.config.vllm as vllm_config_module
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    if getattr(type(current_platform), "stands_in", False):
        return
    (major, minor), name, memory = DEVICE
    real = type(current_platform)
    current_platform.__class__ = type(f"{real.__name__}AsH200", (real,), {
        "stands_in": True,
        "device_type": "cuda",
        "dispatch_key": "CUDA",
        "get_device_capability": classmethod(lambda cls, device_id=0: DeviceCapability(major, minor)),
        "get_device_name": classmethod(lambda cls, device_id=0: name),
        "get_device_total_memory": classmethod(lambda cls, device_id=0: memory),
        "support_static_graph_mode": classmethod(lambda cls: True),
        "graph_pool_handle": lambda self: "graph pool of the stood-in H200",  # no device memory here
    })
    vllm_config_module.HAS_TRITON = True
