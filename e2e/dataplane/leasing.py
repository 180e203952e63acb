"""Looking at what the real decoder holds: its lease API, its metrics, and waiting for them.

Shared by the dataplane tests of the lease API, of retention and of the adaptive paths, so each
reads D the same way: `held` is how many finished requests D's NIXL worker pins blocks for
(Boomerang's lease API), `metric` a sum over D's Prometheus samples.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pdclient

from boomerang.connector.config import LEASE_PATH
from boomerang.local.engine_client import samples, scrape


def lease_api(url: str, token: str, op: str = "", body: Any = None) -> tuple[int, dict[str, Any]]:
    """One call to the lease API: GET without `op`, else POST `op` with `body`."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{url}{LEASE_PATH}{'/' + op if op else ''}",
        data,
        {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def held(plane) -> int:
    """How many finished requests D's worker pins blocks for now. A request that finished
    while D was idle is recorded at D's next engine step: see `held_after_a_step`."""
    status, body = lease_api(plane.d_url, plane.lease_token)
    assert status == 200, body
    return int(body["held"])


def held_after_a_step(plane) -> int:
    """`held` once D's worker has recorded every request that finished: D first serves a
    one-token request of its own (no KV-transfer params, so it retains nothing)."""
    pdclient.single_turn(plane.d_url, plane.model, [17, 18, 19], max_tokens=1)
    return held(plane)


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples at `url` whose labels include `labels`."""
    return sum(
        s.value
        for s in samples(scrape(url), name)
        if all(s.labels.get(k) == v for k, v in labels.items())
    )


def eventually(check: Callable[[], bool], within_s: float) -> bool:
    """Whether `check` came true within `within_s` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
