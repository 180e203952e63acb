"""How much CPU a process group used over a window, from /proc (Linux), per process.

An engine is three processes (API server, engine core, worker) started in one session by the
local runtime (`processes.spawn`: the first is the group's leader), so its CPU is the sum over
its process group. Used by `bench_idle.py` and the idle-decoder engine test.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Stat:
    pid: int
    name: str
    pgrp: int
    cpu_ticks: int
    """user + system time of every thread of the process so far."""


def parse_stat(pid: int, text: str) -> Stat:
    """One `/proc/<pid>/stat` line (the name may hold spaces and parentheses)."""
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): pgrp is field 5, utime 14, stime 15
    return Stat(pid, name, int(fields[2]), int(fields[11]) + int(fields[12]))


def group_stats(pgrp: int, proc: Path = Path("/proc")) -> dict[int, Stat]:
    """Every live process of process group `pgrp`."""
    out = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = parse_stat(int(entry.name), (entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone, or not readable
        if stat.pgrp == pgrp:
            out[stat.pid] = stat
    return out


def thread_stats(pgrp: int, proc: Path = Path("/proc")) -> dict[int, Stat]:
    """Every thread of process group `pgrp`, named `process/thread` (which thread burns a core:
    a spinning worker, NIXL's progress thread, OpenMP)."""
    out = {}
    for pid, process in group_stats(pgrp, proc).items():
        try:
            tasks = list((proc / str(pid) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                stat = parse_stat(int(task.name), (task / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue
            name = f"{process.name}/{stat.name}" + ("" if stat.pid == pid else f"[{stat.pid}]")
            out[stat.pid] = Stat(stat.pid, name, pgrp, stat.cpu_ticks)
    return out


def cores_used(before: dict[int, Stat], after: dict[int, Stat], seconds: float) -> dict[str, float]:
    """Cores each process used between two readings, by its name, and `total`."""
    used: dict[str, float] = {}
    for pid, stat in after.items():
        start = before[pid].cpu_ticks if pid in before else stat.cpu_ticks
        used[stat.name] = (
            used.get(stat.name, 0.0) + (stat.cpu_ticks - start) / TICKS_PER_S / seconds
        )
    used["total"] = sum(used.values())
    return used


def measure(
    groups: dict[str, int], seconds: float, threads: bool = False
) -> dict[str, dict[str, float]]:
    """Cores each named process group used over the next `seconds`, per process (or, with
    `threads`, per thread) and total."""
    read = thread_stats if threads else group_stats
    before = {name: read(pgrp) for name, pgrp in groups.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {name: cores_used(before[name], read(pgrp), elapsed) for name, pgrp in groups.items()}


def busiest(used: dict[str, float], n: int = 4) -> str:
    """The `n` names that used the most, as `name 0.123` (the total left out)."""
    top = sorted(((v, k) for k, v in used.items() if k != "total"), reverse=True)[:n]
    return ", ".join(f"{k} {v:.3f}" for v, k in top)
