"""vLLM 0.25's ngram proposer (vllm/v1/spec_decode/ngram_proposer.py) imports numba at module
level, and numba is not among the packages carried to the GPU machine. The V1 runner makes the
proposer when it is built and calls it after sampling; its drafts are never read here, because
this runtime is the scheduler and hands every verify step its drafts itself
(`scheduled_spec_decode_tokens`). Where numba is missing, the module is replaced by one whose
proposer proposes nothing, so the verify forward the suites test is vLLM's own and the proposer
stays out of the path. Where numba imports, vLLM's own proposer is used.
"""
from __future__ import annotations

import importlib.util
import sys
import types

MODULE = "vllm.v1.spec_decode.ngram_proposer"


class OutOfPathNgramProposer:
    """Proposes no drafts (the runtime supplies them); takes what vLLM's proposer is made with."""

    def __init__(self, vllm_config, *args, **kwargs):
        self.k = vllm_config.speculative_config.num_speculative_tokens

    def propose(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs):
        return [[] for _ in sampled_token_ids]

    def load_model(self, *args, **kwargs) -> None:
        return None


def install(find_spec=importlib.util.find_spec, modules=sys.modules) -> str:
    """Use vLLM's proposer where numba imports, else put the stand-in in its place; says which."""
    if MODULE in modules and not getattr(modules[MODULE], "STAND_IN", False):
        return "vLLM's own (already imported)"
    if find_spec("numba") is not None:
        return "vLLM's own (numba is installed)"
    module = types.ModuleType(MODULE)
    module.NgramProposer = OutOfPathNgramProposer
    module.STAND_IN = True
    modules[MODULE] = module
    return "stand-in proposing no drafts (numba is not installed; the runtime supplies each verify step's drafts)"
