"""Looking at what the real decoder holds: its lease API, its metrics, and waiting for them.

Shared by the dataplane tests of the lease API, of retention and of the adaptive paths, so each
reads D the same way: `held` is how many finished requests D's NIXL worker pins blocks for
(Boomerang's lease API), `metric` a sum over D's Prometheus samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from boomerang.local import pdclient
from boomerang.local.engine_client import lease_status, samples, scrape


def held(plane) -> int:
    """How many finished requests D's worker pins blocks for now. A request that finished
    while D was idle is recorded at D's next engine step: see `held_after_a_step`."""
    status, body = lease_status(plane.d_url, plane.lease_token)
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
