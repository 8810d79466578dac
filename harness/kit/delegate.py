"""The protocol's four policy questions answered by a runtime's policy object (`self.policy`),
which a runtime that drives a real engine writes from its engine's own code or rules."""
from __future__ import annotations

from harness import protocol as p


class PolicyDelegate:
    policy: object  # capture_sizes, padded_size, dispatch and resolve_mode, as the protocol asks them

    def capture_sizes(self, config: p.PolicyConfig) -> list[int]:
        return self.policy.capture_sizes(config)

    def padded_size(self, config: p.PolicyConfig, num_real_tokens: int) -> int | None:
        return self.policy.padded_size(config, num_real_tokens)

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0) -> p.Dispatch:
        return self.policy.dispatch(config, num_real_tokens, num_real_rows, uniform, num_active_loras)

    def resolve_mode(self, request: p.ResolveRequest) -> p.Resolution:
        return self.policy.resolve_mode(request)


# The public names (docs/api.md; tests/test_public_api.py holds the two to each other).
__all__ = [
    "PolicyDelegate",
]
