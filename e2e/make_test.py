"""`make test` as timed phases: what a fresh machine installs and builds, then lint, types and
every test, with a table of where the time went printed at the end (also after a failure).

Why a driver rather than make's prerequisites: on a cold machine the Go build of the control
plane (CPU-bound, about 13 minutes on 2 cores) and the vLLM engine install plus the CPU images
(mostly downloads and unpacking) used to run one after the other. Here they overlap, and the
Debian packages every later step needs are installed first, in one place, so that no two
`apt-get` runs fight over dpkg's lock. The per-suite part of the table comes from
`pytest_phases.py`, a pytest plugin that sums each suite's setup, call and teardown time.

Usage: python3 e2e/make_test.py [pytest arguments]   (the Makefile passes $(PYTEST_ARGS))
Env:   MAKE (default: make), BOOMERANG_CACHE (where every install is cached).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAKE = os.environ.get("MAKE", "make")
# The images the tests build through the cache, prebuilt while the Go build runs. The GPU
# stand-in is not among them: it belongs to `make test-release`.
CPU_IMAGES = ("operator", "router", "connector", "redis")


class Phases:
    """Runs commands as named phases and keeps their wall times, in order."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float, str]] = []
        self.lock = threading.Lock()

    def run(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> bool:
        started = time.monotonic()
        print(f"\n=== phase {name}: {' '.join(cmd)}", flush=True)
        code = subprocess.run(list(cmd), cwd=REPO, env=env, check=False).returncode
        with self.lock:
            self.times.append(
                (name, time.monotonic() - started, "ok" if code == 0 else f"rc {code}")
            )
        return code == 0

    def together(self, *groups: list[tuple[str, Sequence[str]]]) -> bool:
        """Runs each group's phases in order, the groups side by side; True if all passed."""
        results: list[bool] = []

        def run_group(group: list[tuple[str, Sequence[str]]]) -> None:
            results.append(all(self.run(name, cmd) for name, cmd in group))

        threads = [threading.Thread(target=run_group, args=(g,)) for g in groups]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return all(results)


def venv_python() -> str:
    out = subprocess.run(
        [MAKE, "-s", "print-venv"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return str(Path(out.stdout.strip()) / "bin" / "python")


def table(phases: Phases, suites: dict[str, float], total: float) -> str:
    rows = [f"{'phase':<44} {'time':>9}  result"]
    for name, seconds, result in phases.times:
        rows.append(f"{name:<44} {clock(seconds):>9}  {result}")
    if suites:
        rows.append("pytest, by suite (setup + call + teardown):")
        for suite, seconds in sorted(suites.items(), key=lambda kv: -kv[1]):
            rows.append(f"  {suite:<42} {clock(seconds):>9}")
    rows.append(f"{'total':<44} {clock(total):>9}")
    return "\n".join(rows)


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def main(argv: list[str]) -> int:
    started = time.monotonic()
    phases = Phases()
    e2e_env = {**os.environ, "PYTHONPATH": str(REPO / "e2e")}
    ok = phases.run(
        "debian packages (redis lua prometheus node)",
        [MAKE, "-s", "redis", "lua", "prometheus", "node"],
    )
    ok = ok and phases.run(
        "debian packages (buildah, mmdebstrap)",
        [sys.executable, "-c", "import sys; from images.buildah import install_tools; "
                               "sys.exit(1 if install_tools() else 0)"],
        env=e2e_env,
    )  # fmt: skip
    ok = ok and phases.run("dev venv", [MAKE, "-s", "dev"])
    ok = ok and phases.together(
        [("control plane (Go)", [MAKE, "-s", "tools"])],
        [
            ("vLLM CPU engine venv", [MAKE, "-s", "engine"]),
            ("images (" + " ".join(CPU_IMAGES) + ")",
             ["bash", "e2e/images/build.sh", "--no-install", *CPU_IMAGES]),
        ],
    )  # fmt: skip
    ok = ok and phases.run("lint", [MAKE, "-s", "lint"])
    ok = ok and phases.run("types", [MAKE, "-s", "types"])
    suites: dict[str, float] = {}
    outcomes: dict[str, int] = {}
    if ok:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "suites.json"
            env = {**e2e_env, "BOOMERANG_PHASES": str(report)}
            ok = phases.run("pytest", [venv_python(), "-m", "pytest", "-p", "pytest_phases",
                                       *argv], env=env)  # fmt: skip
            if report.exists():
                found = json.loads(report.read_text())
                suites, outcomes = found["suites"], found["outcomes"]
    print("\n" + table(phases, suites, time.monotonic() - started), flush=True)
    if outcomes:  # pytest's counts once more, as the log's last line
        print(closing_line(outcomes), flush=True)
    return 0 if ok else 1


def closing_line(outcomes: dict[str, int]) -> str:
    """`pytest: N passed, N failed[, N skipped][, N errors]`."""
    line = f"pytest: {outcomes.get('passed', 0)} passed, {outcomes.get('failed', 0)} failed"
    if outcomes.get("skipped"):
        line += f", {outcomes['skipped']} skipped"
    if outcomes.get("error"):
        line += f", {outcomes['error']} errors"
    return line


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
