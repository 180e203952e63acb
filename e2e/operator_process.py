"""The operator as a local process that authenticates as the chart's ServiceAccount.

In a real cluster the operator pod gets the ServiceAccount token the chart creates, and every
call it makes is checked against the ClusterRole the chart grants. Here the operator runs on the
host (kwok pods run no processes), but with a kubeconfig holding a TokenRequest token for that
same ServiceAccount, so RBAC is enforced exactly as in the pod: a missing permission shows up as
a 403 in its log and a resource that never gets Ready.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from procs import stop_process


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log: Path
    # No metrics port: suites running side by side on one host would fight over the default.
    args: tuple[str, ...] = ("--all-namespaces", "--metrics-port=0")
    env: Mapping[str, str] = field(default_factory=dict)  # on top of this process's own
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _log_offset: int = field(default=0, repr=False)

    def start(self) -> None:
        env = {**os.environ, **self.env}
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PYTHONUNBUFFERED"] = "1"
        with self.log.open("ab") as out:
            out.write(f"\n=== start #{self.starts + 1} ===\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "boomerang.operator", *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.log.parent,
                env=env,
                start_new_session=True,
            )
        self.starts += 1

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, grace: float = 20.0) -> None:
        stop_process(self.popen, sig, grace)
        self.popen = None

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies or the OOM killer strikes."""
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def rss_mib(self) -> float:
        """Resident memory of the operator process (VmRSS), in MiB."""
        if not self.alive() or self.popen is None:
            return 0.0
        status = Path(f"/proc/{self.popen.pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
