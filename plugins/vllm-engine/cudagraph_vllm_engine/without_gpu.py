"""vLLM 0.25's policy code on a machine without a GPU: the `vllm-engine-policy` runtime answers the
policy questions with the same code as `vllm-engine` (policy.py), so its answers can be checked,
and compared with vLLM 0.33's (scripts/vllm_versions_compare.py), anywhere vLLM 0.25 imports.

Without a GPU vLLM picks a platform with no device type, no graphs and no Triton driver. For as long
as this runtime lives, two things stand in, each for a device query the config code makes:

- the platform answers as the H200 the vllm-engine lane runs on: device type "cuda", capability
  9.0, its name and memory, graphs supported, a placeholder graph-pool handle (nothing allocated);
- vLLM's config module is told Triton is present (`vllm.config.vllm.HAS_TRITON`), as it is on the
  H200: without it VllmConfig refuses the V2 model runner, which the engine runs.

Nothing else is patched; the rest is vLLM 0.25's own code, called as policy.py calls it.
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
