"""Starting, watching and stopping local processes (engines, routers) by pid.

Shared by the local runtime (`boomerang up/down`), the data-plane tests and the benchmark, so
that all three start engines the same way. Processes run in their own session (process group)
and are stopped by signalling that group: an engine is three processes (API server, engine
core, worker) and none may be left behind. Only pids this code recorded are ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessSpec:
    """One process to run: what, with which environment, where it logs, how to see it's up."""

    name: str
    cmd: Sequence[str]
    env: Mapping[str, str]
    log: Path
    health_url: str


class StartError(RuntimeError):
    """A process exited or stayed unhealthy while starting; the message ends with its log."""


def spawn(spec: ProcessSpec) -> subprocess.Popen[bytes]:
    """Start the process in a new session, stdout and stderr appended to its log."""
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    with spec.log.open("ab") as log:
        return subprocess.Popen(
            list(spec.cmd),
            env=dict(spec.env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def is_healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(200 <= resp.status < 300)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def tail(path: Path, lines: int = 30, cause_lines: int = 40) -> str:
    """The log's last `lines`, after its first traceback when that starts above them.

    A vLLM engine that fails to start logs the engine core's own exception first and the API
    server's wrapper ("Engine core initialization failed. See root cause above") last: the
    tail alone hides the cause."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    last = text[-lines:]
    first = next((i for i, line in enumerate(text) if "Traceback (most recent call" in line), None)
    if first is None or first >= len(text) - lines:
        return "\n".join(last)
    cause = text[first : min(first + cause_lines, len(text) - lines)]
    return "\n".join([*cause, "[...]", *last])


def wait_healthy(spec: ProcessSpec, pid: int, timeout: float) -> float:
    """Block until the health URL answers 2xx; returns seconds waited. Raises StartError."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not alive(pid):
            raise StartError(
                f"{spec.name} exited while starting; log {spec.log}:\n{tail(spec.log)}"
            )
        if is_healthy(spec.health_url):
            return time.monotonic() - start
        time.sleep(1.0)
    raise StartError(
        f"{spec.name} not healthy after {timeout:.0f}s; log {spec.log}:\n{tail(spec.log)}"
    )


def stop(pid: int, timeout: float = 60.0, sig: int = signal.SIGTERM) -> None:
    """Signal the leader `pid` and wait for it; then SIGKILL whatever is left of its group.

    Only the leader gets SIGTERM: `boomerang-engine` forwards it to vLLM's API server, which
    drains in-flight requests and then stops its own engine processes. Signalling the whole
    group would kill the engine core under requests still being served."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if sig == signal.SIGKILL:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            break
        time.sleep(0.25)
    # The group may still hold children (engine core, worker) after the leader went.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)
    gone_by = time.monotonic() + GROUP_EXIT_S
    while group_members(pid) and time.monotonic() < gone_by:
        time.sleep(0.1)


GROUP_EXIT_S = 30.0
"""How long `stop` waits for a killed group's last process to exit: SIGKILL is delivered at
once, but a process holding gigabytes takes a moment to go, and until it has, its ports are
bound. An engine started on the same ports meanwhile dies with "Address already in use" (seen
here: an engine core left behind held the KV-events port of the next engine set)."""


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, from /proc (empty where
    there is no /proc: nothing to wait for)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, pgrp, ...
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def kill(pid: int) -> None:
    """Kill the whole group at once, as a crash would (no draining)."""
    stop(pid, timeout=10.0, sig=signal.SIGKILL)
