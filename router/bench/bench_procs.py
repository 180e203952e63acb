"""The router benchmarks' processes: started pinned to CPUs, and what /proc says they used.

Kept in one place because `router_bench` (the router against the fake engines) and
`wake_cost` (a bare echo server) place their processes the same way and must count CPU,
system calls and wake-ups the same way for their tables to be read side by side.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys


def use_uvloop() -> str:
    """Run asyncio on uvloop when it is installed (as the router does); the loop's name."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def spawn(args: list[str], cpus: list[int] | None) -> subprocess.Popen[bytes]:
    """A Python child of this interpreter, pinned to `cpus` (None: where this process runs),
    importing from where this process does (pytest adds the bench folders to `sys.path` only)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, *args], env=env)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)  # right away: before it starts any thread
    return proc


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def io_calls(pid: int) -> int:
    """Read and write system calls process `pid` has made so far (/proc/PID/io syscr + syscw)."""
    with open(f"/proc/{pid}/io") as f:
        counts = dict(line.split(": ") for line in f.read().splitlines())
    return int(counts["syscr"]) + int(counts["syscw"])


def wakes(pid: int) -> int:
    """How often process `pid`'s main thread (an event loop's) went to sleep and was woken so
    far: its voluntary context switches (/proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise RuntimeError(f"no voluntary_ctxt_switches in /proc/{pid}/status")
