"""A process that fails to start is reported with its cause, not only its last lines; a
stopped one leaves no process of its group behind.

vLLM's API server logs the engine core's exception first and its own wrapper ("See root cause
above") last; CI once showed only the wrapper, so the cause of a failed start was lost.
"""

from __future__ import annotations

import time
from pathlib import Path

from boomerang.local import processes
from boomerang.local.processes import tail


def test_tail_keeps_the_first_traceback_above_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    cause = ["Traceback (most recent call last):", "  File core.py", "OSError: port in use"]
    wrapper = [f"wrapper line {i}" for i in range(50)]
    log.write_text("\n".join(["starting", *cause, *wrapper]) + "\n")
    shown = tail(log, lines=30).splitlines()
    assert shown[:3] == cause
    assert shown[-31] == "[...]"
    assert shown[-30:] == wrapper[-30:]
    assert len(shown) <= 40 + 1 + 30


def test_tail_is_the_last_lines_when_the_traceback_is_among_them(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    lines = [f"line {i}" for i in range(40)] + ["Traceback (most recent call last):", "boom"]
    log.write_text("\n".join(lines) + "\n")
    assert tail(log, lines=30).splitlines() == lines[-30:]


def test_tail_of_a_missing_log(tmp_path: Path) -> None:
    assert tail(tmp_path / "absent.log") == "(no log)"


def test_stop_returns_once_no_process_of_the_group_is_left(tmp_path: Path) -> None:
    """The leader's children (an engine's core and worker) are gone when `stop` returns, so
    the next engine on the same ports never finds them bound."""
    import subprocess

    leader = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(processes.group_members(leader.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes.group_members(leader.pid)) == 3  # the shell and its two children
    processes.stop(leader.pid, timeout=2.0)
    assert processes.group_members(leader.pid) == []
