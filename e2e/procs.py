"""A process the e2e harness starts and stops: the control plane's binaries, the real node's
daemons, the operator. Apart from `cluster.py` so that the real node (`realnode.py`), which the
cluster starts, and the tests can use it without importing the cluster."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path


def stop_process(popen: subprocess.Popen[bytes] | None, sig: int, grace: float) -> None:
    """Send `sig`, wait up to `grace` seconds, then SIGKILL; a finished process is left alone."""
    if popen is None or popen.poll() is not None:
        return
    popen.send_signal(sig)
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal reaches only us; we stop them
                env=env,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def terminate(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` (the apiserver can linger after it stops serving)."""
        stop_process(self.popen, signal.SIGTERM, grace)
        self.popen = None
