"""`lmdeploy_code`: LMDeploy 0.18.0's own modules where they import (the GPU machine after
scripts/lmdeploy/install.sh, or a CPU machine after `python scripts/lmdeploy/fetch.py --cpu-site`),
else the test skips saying how to get them."""
import sys
from pathlib import Path

import pytest

CPU_SITE = Path(__file__).resolve().parents[3] / ".lmdeploy_gpu" / "cpu_site"


@pytest.fixture(scope="session")
def lmdeploy_code():
    if CPU_SITE.is_dir() and str(CPU_SITE) not in sys.path:
        sys.path.append(str(CPU_SITE))  # appended: what the project installs wins over the scratch site
    return pytest.importorskip("lmdeploy.pytorch.backends.cuda.graph_runner.runner", reason="LMDeploy 0.18.0 does not "
                               "import here (python scripts/lmdeploy/fetch.py --cpu-site, or scripts/lmdeploy/install.sh)")
