"""The runtime as the suites see it: every policy answer checked for its form (harness.runtime.validate)
before a suite reads it. No torch here: a policy-only run must not pay for importing it.
"""
from __future__ import annotations

from harness.runtime import validate
from harness.checks import Check


class ProtocolError(AssertionError):
    """A runtime answered with something the protocol does not allow (outside a bound check)."""


def answer(check: Check | None, who: str, call: str, result, problem: str | None):
    """`who`'s answer to `call`, failed at the protocol boundary where it has the wrong form
    (`problem`, from harness.runtime.validate); outside a test (no check bound) a ProtocolError."""
    if problem:
        what = f"the {who}'s {call} {problem}"
        if check is None:
            raise ProtocolError(what)
        check.fail(what, source="the protocol (harness/protocol.py)")
    return result


class RuntimeProxy:
    """The runtime, with every policy answer checked for its form before a suite sees it."""

    def __init__(self, runtime):
        self.wrapped = runtime
        self.name, self.version, self.capabilities = runtime.name, runtime.version, runtime.capabilities
        self._check: Check | None = None

    def bind(self, check: Check | None) -> None:
        self._check = check

    def __getattr__(self, attr):
        return getattr(self.wrapped, attr)

    def _answer(self, call: str, result, problem: str | None):
        return answer(self._check, "runtime", call, result, problem)

    def capture_sizes(self, config):
        result = self.wrapped.capture_sizes(config)
        return list(self._answer("capture_sizes()", result, validate.sizes(result)))

    def padded_size(self, config, num_real_tokens):
        result = self.wrapped.padded_size(config, num_real_tokens)
        return self._answer(f"padded_size(num_real_tokens={num_real_tokens})", result, validate.padded_size(result, num_real_tokens))

    def dispatch(self, config, num_real_tokens, num_real_rows=None, uniform=False, num_active_loras=0):
        args = (config, num_real_tokens, num_real_rows, uniform) + ((num_active_loras,) if num_active_loras else ())
        result = self.wrapped.dispatch(*args)
        return self._answer(f"dispatch(num_real_tokens={num_real_tokens}, num_real_rows={num_real_rows}, uniform={uniform})", result,
                            validate.dispatch(result))

    def resolve_mode(self, request):
        result = self.wrapped.resolve_mode(request)
        return self._answer(f"resolve_mode({request})", result, validate.resolution(result))

    def dp_dispatch(self, config, ranks):
        result = self.wrapped.dp_dispatch(config, ranks)
        return list(self._answer("dp_dispatch()", result, validate.dispatches(result, len(ranks))))

    def build(self, config):
        result = self.wrapped.build(config)
        return self._answer("build()", result, validate.engine(result))
