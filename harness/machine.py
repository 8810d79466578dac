"""Whether this machine has a CUDA device, answered without importing torch where it can be.

Importing torch costs seconds; a session that only asks policy questions, on a machine with no
NVIDIA driver at all, should not pay it to learn that there is no GPU.
"""
from __future__ import annotations

import os
import sys

DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")  # the driver's nodes (dxg: WSL)


def cuda_available() -> bool:
    if "torch" not in sys.modules and sys.platform == "linux" and not any(map(os.path.exists, DEVICE_FILES)):
        return False  # no driver, so no device, whatever torch would say
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
