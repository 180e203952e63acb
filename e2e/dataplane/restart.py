"""Restarting the dataplane's decoder under another environment, as a rollout or a build
without the plugin would run it, and waiting until a router has readmitted it.

Shared by the tests that need a decoder unlike the session's (another revision, no plugin);
each restarts the session's own D again when it is done, so later tests find it as before.
"""

from __future__ import annotations

import dataclasses
import time

from boomerang.local import pdclient, processes

RESTART_S = 600.0


def restart_decoder(dataplane, router: str, env: dict[str, str] | None = None) -> None:
    """D again with `env` added to its environment (None: as the session started it), once
    the router readmits it and has read its `/metrics`."""
    dataplane.kill("decode")
    start_decoder(dataplane, router, env)


def start_decoder(dataplane, router: str, env: dict[str, str] | None = None) -> None:
    """Start the session's D again (after it was killed), with `env` added to its
    environment, and wait until `router` readmits it and has read its `/metrics`."""
    spec = dataplane.specs["decode"]
    if env:
        spec = dataclasses.replace(spec, env={**spec.env, **env})
    dataplane.pids["decode"] = processes.spawn(spec).pid
    processes.wait_healthy(spec, dataplane.pids["decode"], RESTART_S)
    deadline = time.monotonic() + 120
    while pdclient.get_json(f"{router}/ready").get("decode") != 1:
        assert time.monotonic() < deadline, "the router never readmitted the restarted decoder"
        time.sleep(0.5)
    time.sleep(2.0)  # the probe that readmitted D reads its /metrics right after
