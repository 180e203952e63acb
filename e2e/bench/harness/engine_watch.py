"""What the benchmark asserts and records about the engines around each run.

Why: a run that starts while another run's work is still on the engines, or while a decoder
still retains blocks, measures the leftovers, and a run that starved its neighbour hides it in
a latency. So before every run each engine must be idle by its own metrics (nothing running or
waiting, no KV block in use: a retained block counts as used), or the benchmark stops; and each
engine's processes' CPU seconds (API server, engine core, worker: its process group) are read
before and after, so that a run that burned CPU it did not serve with shows it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence

from boomerang.local.engine_client import scrape

TICKS = os.sysconf("SC_CLK_TCK")
KV_USAGE = "vllm:kv_cache_usage_perc"
"""vLLM's share of an engine's KV blocks in use (0-1); a retained block counts as used."""
BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting", KV_USAGE)


class NotIdle(RuntimeError):
    """An engine still had work or held KV blocks when a run was about to start."""


def busy(page: str) -> dict[str, float]:
    """The engine's running and waiting requests and KV usage, from its /metrics text."""
    out = dict.fromkeys(BUSY, 0.0)
    for line in page.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            with contextlib.suppress(ValueError):
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def wait_idle(urls: Sequence[str], timeout_s: float = 120.0) -> dict[str, dict[str, float]]:
    """Waits until every engine is idle; NotIdle (naming what is left) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = {url: busy(scrape(url)) for url in urls}
        left = {u: s for u, s in state.items() if any(v > 0 for v in s.values())}
        if not left:
            return state
        if time.monotonic() > deadline:
            raise NotIdle(f"engines not idle after {timeout_s:.0f} s: {left}")
        time.sleep(0.5)


def group_cpu_seconds(pgid: int, proc: str = "/proc") -> float:
    """User and system CPU seconds of every live process in process group `pgid`."""
    total = 0
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp ...
            total += int(fields[11]) + int(fields[12])  # utime stime
    return total / TICKS


def cpu_seconds(groups: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds per engine name, from their process groups (`name -> pgid`)."""
    return {name: group_cpu_seconds(pgid) for name, pgid in groups.items()}


def spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


def idle_cpu(groups: Mapping[str, int], seconds: float = 5.0) -> dict[str, float]:
    """Each engine's CPU use while idle, in cores (a spinning loop reads close to 1)."""
    before = cpu_seconds(groups)
    time.sleep(seconds)
    return {k: v / seconds for k, v in spent(before, cpu_seconds(groups)).items()}


def names(urls: Iterable[str]) -> list[str]:
    return [u.rsplit(":", 1)[-1] for u in urls]
