"""D confirms a lease before P may read it: the claim of a turn's handle.

Why: a decoder running Boomerang's plugin with its lease API on lets retained leases yield to
live work when its KV cache is full (`boomerang.connector.plugin.retained`; it says so with the
`pressure` capability on `/metrics`). A yielded lease's blocks are free and soon hold another
request's KV, and NIXL reads are one-sided: a P that pulled them would compute on someone
else's KV without an error anywhere. So on such a decoder the router asks D to claim the lease
(D answers whether it still holds it, and keeps it through pressure if so) and offers the
handle to P only when D confirmed. Anything else (D answered gone, refused, failed, timed
out) means the handle is not offered to P: the turn treats it as released (D's prefix cache
may still hold the blocks for a continued turn; P computes otherwise). A decoder without the
capability never releases a lease on its own: its handles are offered as before, unclaimed.

The claim starts as soon as the turn has taken the handle, and only a pull waits for D's
answer (D answers between two of its engine steps): a turn that continues on D or recomputes
on P never reads the lease. A turn that claimed a handle and then did not offer it to P (it
went back to the store) unclaims it in the background, so that it may yield to pressure again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Literal

from boomerang.facts.engine import PRESSURE_CAPABILITY
from boomerang.router.conversation import Handle
from boomerang.router.engines.endpoints import Endpoint
from boomerang.router.metrics import Metrics
from boomerang.router.retention.lease_client import LeaseClient, LeaseFailure

log = logging.getLogger("boomerang.router")


Claim = Literal["unneeded", "held", "gone", "failed"]
"""D's answer to the claim of a taken handle's lease: `unneeded`, D never releases
a lease on its own; `held`, D confirmed it; `gone`, D no longer holds it; `failed`, no
answer. Only the first two may be offered to P."""


def needs_claim(holder: Endpoint | None) -> bool:
    """Whether the decoder's leases may yield to pressure (it publishes the capability)."""
    return holder is not None and PRESSURE_CAPABILITY in holder.capabilities


def may_offer(claim: Claim) -> bool:
    return claim in ("unneeded", "held")


class Claims:
    """The router's claims on D's leases, through D's lease API."""

    def __init__(self, leases: LeaseClient, metrics: Metrics) -> None:
        self._leases = leases
        self._metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()

    async def claim(self, holder: Endpoint | None, handle: Handle) -> Claim:
        """Claim `handle`'s lease on its decoder (see the module docstring)."""
        if not needs_claim(holder):
            return self._count("unneeded")
        assert holder is not None
        rid = _request_id(handle)
        if rid is None:
            return self._count("gone")
        try:
            held, _gone = await self._leases.claim(holder.url, [rid])
        except LeaseFailure as exc:
            log.warning("Claim failed", extra={"engine": holder.url, "error": str(exc)})
            return self._count("failed")
        return self._count("held" if rid in held else "gone")

    def unclaim(self, handle: Handle) -> None:
        """Let a claimed lease yield again (background; a lost unclaim only keeps it pinned
        until P reads it, the router releases it or D's TTL ends)."""
        rid = _request_id(handle)
        if rid is not None:
            self._spawn(self._unclaim(handle.decode_url, rid))

    async def _unclaim(self, url: str, rid: str) -> None:
        try:
            await self._leases.unclaim(url, [rid])
        except LeaseFailure as exc:
            log.info("Unclaim failed", extra={"engine": url, "error": str(exc)})

    def _count(self, claim: Claim) -> Claim:
        self._metrics.claims.labels(claim).inc()
        return claim

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _request_id(handle: Handle) -> str | None:
    if handle.released:
        return None
    try:
        rid = handle.kv_params().get("remote_request_id")
    except ValueError:
        return None
    return rid if isinstance(rid, str) and rid else None
