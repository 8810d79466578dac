"""0.4.0's paths of the V1 runtime (cudagraph_vllm_engine.v1_*) import the modules that moved into this
plugin, with a DeprecationWarning naming the new path (harness.moved.module_moved), until 0.6.0."""
import importlib
import subprocess
import sys
import warnings

import pytest

from harness import moved

OLD_TO_NEW = {
    "cudagraph_vllm_engine.v1_runtime": "cudagraph_vllm_engine_v1.runtime",
    "cudagraph_vllm_engine.v1_engine": "cudagraph_vllm_engine_v1.engine",
    "cudagraph_vllm_engine.v1_lora": "cudagraph_vllm_engine_v1.lora",
    "cudagraph_vllm_engine.v1_observer": "cudagraph_vllm_engine_v1.observer",
    "cudagraph_vllm_engine.v1_policy": "cudagraph_vllm_engine_v1.policy",
    "cudagraph_vllm_engine.v1_smoke": "cudagraph_vllm_engine_v1.smoke",
    "cudagraph_vllm_engine.ngram_stand_in": "cudagraph_vllm_engine_v1.ngram_stand_in",
}


@pytest.mark.parametrize("old", sorted(OLD_TO_NEW))
def test_an_old_path_is_the_new_module_with_a_deprecation_naming_it(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        __import__(old)
    assert sys.modules[old] is importlib.import_module(OLD_TO_NEW[old])
    assert [w.category for w in caught] == [DeprecationWarning]
    message = str(caught[0].message)
    assert f"{old} moved to {OLD_TO_NEW[old]} in 0.5.0" in message and moved.NAMES_REMOVED_IN in message
    assert caught[0].filename == __file__  # blamed on the importer, not on the shim
    assert moved.MODULES_MOVED[old] == (OLD_TO_NEW[old], "0.5.0")


def test_the_old_smoke_command_still_runs_the_new_one():
    done = subprocess.run([sys.executable, "-m", "cudagraph_vllm_engine.v1_smoke", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "V1 smoke stage" in done.stdout and "moved to cudagraph_vllm_engine_v1.smoke" in done.stderr
