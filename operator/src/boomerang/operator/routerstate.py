"""Read what an Adaptive router has learned, for status: the operator's one call to a child.

Every POLL_INTERVAL_S (a kopf timer, Adaptive deployments only, handlers.py) the operator asks
the router's Service for `GET /boomerang/v1/state` (no API key: it holds no conversation data),
maps the answer to status fields (tuning.py, pure) and refreshes status through the same gate
as every other status write, so it lands only when a value changed. It is informational: a
router that cannot be reached (not started yet, an operator outside the cluster) leaves the
last values in place and sets no condition; the log says so once, not every poll.

With several router replicas the Service answers from one of them: status shows that replica's
view (with the in-memory store and client-IP affinity, the same replica each time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from pydantic import ValidationError

from boomerang.operator import reconcile, render, tuning
from boomerang.operator.api import DisaggregatedDeployment
from boomerang.operator.kube import KubeAPI

log = logging.getLogger(__name__)
POLL_INTERVAL_S = 30.0
TIMEOUT_S = 5.0

Fetch = Callable[[str], Awaitable[Any]]


class StateUnavailable(Exception):
    """The router's state could not be read; the message says why, briefly."""


async def fetch_state(url: str, timeout_s: float = TIMEOUT_S) -> Any:
    """The router's state document (parsed JSON), or StateUnavailable."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status != 200:
                raise StateUnavailable(f"HTTP {response.status} from {url}")
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise StateUnavailable(f"{type(exc).__name__} from {url}: {exc}") from exc


class Poller:
    """Polls the routers of Adaptive deployments; remembers whose last poll failed, so the
    log says it on the first failure and on recovery only."""

    def __init__(self, fetch: Fetch = fetch_state) -> None:
        self._fetch = fetch
        self._unreachable: set[tuple[str, str]] = set()

    async def poll(
        self,
        body: Mapping[str, Any],
        kube: KubeAPI,
        now: Callable[[], str],
        gate: reconcile.StatusGate,
    ) -> reconcile.Outcome | None:
        """Read one Adaptive deployment's router state and refresh its status with it.

        None when nothing was refreshed: not Adaptive, an invalid spec (the reconcile reports
        it), a router that could not be read, or one that does not run adaptive yet.
        """
        try:
            dd = DisaggregatedDeployment.model_validate(dict(body))
        except ValidationError:
            return None
        if not tuning.adaptive(dd):
            return None
        key = (dd.namespace, dd.name)
        try:
            state = await self._fetch(render.router_state_url(dd))
        except StateUnavailable as exc:
            if key not in self._unreachable:
                self._unreachable.add(key)
                log.warning("Failed to read router state name=%s reason=%s", dd.name, exc)
            return None
        if key in self._unreachable:
            self._unreachable.discard(key)
            log.info("Read router state name=%s", dd.name)
        values = tuning.learned(state)
        if values is None:
            return None
        return await asyncio.to_thread(
            reconcile.refresh_status, body, kube, now(), gate, learned=values
        )

    def forget(self, key: tuple[str, str]) -> None:
        """The resource is gone: drop what is remembered of its router."""
        self._unreachable.discard(key)
