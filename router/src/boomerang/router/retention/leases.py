"""Retention that follows the traffic: the I/O around `policy.py`, and D's lease API.

Why it exists: D pins every finished request's blocks for its whole TTL. In adaptive mode the
router keeps a handle only as long as the next turn is likely to come (a quantile of the
learned gap between turns, per tenant, within the handle TTL) and within a budget of D's KV
blocks, and releases what will never be offered (a superseded or recomputed handle, a
conversation the client ended) through D's lease API (`boomerang.connector.plugin.leases`, served
by Boomerang's vLLM plugin on D's port). The pure parts (the gap learner, the bounds, the
ledger of leases) are `policy.py`; this module calls D and the store.

Rules (correctness over reuse):
- A lease is released only once no turn can hold its handle: the sweeper takes the handle out
  of the store first (`store.take`, atomic) and skips a lease whose handle a turn holds; the
  flow hands over the handles a turn will never offer (`superseded`); a handle replaced in the
  store is released only when it was provably still there (`filed`).
- A failed release is counted and left to D's TTL, never retried in a loop. A handle taken out
  for a release that may have happened (D failed after the request was sent) is not put back.
- A released handle goes back to the store marked `released` (`tuning.reuse_released`, on by
  default) until its TTL: D's prefix cache keeps the freed blocks until it needs the room, so
  the flow may still continue a late turn on that decoder; it is never offered to P.
- Static mode: no lease is kept and the sweeper does nothing; what acts is the release of a
  handle a turn will never offer (declined by the plan, rejected by the check: `superseded`)
  and what a client asks for (ending or renewing a conversation, `end` and `renew`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from boomerang.facts import default_handle_ttl, state
from boomerang.router import params_codec
from boomerang.router.apis import hints
from boomerang.router.config import RouterConfig
from boomerang.router.conversation import Handle
from boomerang.router.metrics import Metrics
from boomerang.router.retention.lease_client import LeaseClient, LeaseFailure, Renewal
from boomerang.router.retention.policy import (
    GapLearner,
    Lease,
    Ledger,
    RetentionBounds,
    retention_s,
)
from boomerang.router.store import ConversationStore, MemoryStore

__all__ = ["LeaseClient", "LeaseFailure", "Renewed", "Retention", "block_count", "request_id_of"]

log = logging.getLogger("boomerang.router")
SWEEP_INTERVAL_S = 1.0
NO_CONTROL_S = 60.0
"""After D answered that it offers no lease control (no plugin, 401, 403, 501, no token here),
its leases are left to its TTL for this long before the router asks again."""
Reason = Literal["superseded", "expired", "ended", "recompute", "budget"]
UNKNOWN: Any = object()
"""`filed(replaced=...)` default: the flow did not say what its `put` replaced."""


def request_id_of(params: Mapping[str, Any]) -> str | None:
    """D's engine request id of a handle's params (the key of D's lease)."""
    rid = params.get("remote_request_id")
    return rid if isinstance(rid, str) and rid else None


def block_count(params: Mapping[str, Any]) -> int:
    """How many of D's KV blocks a handle's params name."""
    groups = params.get("remote_block_ids")
    if not isinstance(groups, list):
        return 0
    return sum(len(g) for g in groups if isinstance(g, list))


@dataclass(frozen=True)
class Renewed:
    """A renewed conversation: how long the router now offers its handle."""

    expires_in_s: float


class Retention:
    """Leases of the handles this router filed: when to release them, and releasing them."""

    def __init__(
        self,
        config: RouterConfig,
        store: ConversationStore,
        client: LeaseClient,
        metrics: Metrics,
        *,
        decoders: Callable[[], Mapping[str, int | None]] | None = None,
        p_holds: Callable[[int], bool] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._store = store
        self._client = client
        self._metrics = metrics
        self._decoders = decoders or dict
        """The decode engines' URLs and their KV blocks in all (from their `/metrics`); None
        or 0: unknown, so no budget applies to that engine."""
        self._p_holds = p_holds
        """Whether a prefill engine holds a block (the KV index; None: no index): leases whose
        history P still holds go first when D is over its budget (`Ledger.over_budget`)."""
        self._clock = clock
        self.learner = GapLearner()
        self.ledger = Ledger()
        self._no_control_until: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def adaptive(self) -> bool:
        """Read on every call: the tuning section is reloaded while the router runs."""
        return self._config.tuning.mode == "adaptive"

    def retention_s(self, tenant: str | None, now: float) -> float:
        """How long a handle of `tenant` is kept now (learned, within the bounds)."""
        t = self._config.tuning
        bounds = RetentionBounds(t.retention_quantile, t.retention_min_s, self._ceiling_s)
        return retention_s(self.learner.quantile(tenant, t.retention_quantile, now), bounds)

    @property
    def _ceiling_s(self) -> float:
        return self._config.effective_handle_ttl_s

    # -- what the flow tells it ------------------------------------------------------------

    def filed(
        self,
        key: bytes,
        handle: Handle,
        tenant: str,
        now: float,
        *,
        replaced: Any = UNKNOWN,
        hint_s: float | None = None,
        p_probe: int | None = None,
    ) -> None:
        """A handle was stored under `key`. `replaced` is what that put replaced (the store's
        `put` returns it); a replaced lease is released only when its handle was provably in
        the store (then no turn holds it): the replaced handle is its own, or the store is this
        process's memory store, where `taken` drops a lease in the step its handle left.
        `hint_s`, the client's capped hint, replaces the learned retention of this lease;
        `p_probe` names the last block of the prompt P computed (`Lease.p_probe`)."""
        if not self.adaptive:
            return
        lease = self._lease(key, handle, tenant, now, hint_s)
        if lease is None:
            return
        lease = replace(lease, p_probe=p_probe)
        old = self.ledger.add(lease, now)
        if old is None or old.request_id == lease.request_id:
            return
        if replaced is UNKNOWN:
            proven = isinstance(self._store, MemoryStore)
        else:
            proven = isinstance(replaced, Handle) and _rid_or_none(replaced) == old.request_id
        if proven:
            self._spawn(self._release_quietly(old.decode_url, old.request_id, "superseded"))

    def _lease(
        self, key: bytes, handle: Handle, tenant: str, now: float, hint_s: float | None
    ) -> Lease | None:
        if handle.released:
            return None  # D pins nothing for it: no lease to keep or release
        try:
            params = handle.kv_params()
        except ValueError:
            return None
        rid = request_id_of(params)
        if rid is None:
            return None
        keep_s = self.retention_s(tenant, now) if hint_s is None else hint_s
        self._metrics.lease_retention.labels("learned" if hint_s is None else "hint").observe(
            keep_s
        )
        deadline = min(now + keep_s, handle.expires_at)  # the handle TTL bounds every lease
        return Lease(key, handle.decode_url, rid, block_count(params), now, deadline, tenant)

    def learned_s(self, tenant: str, now: float) -> float | None:
        """The learned retention for `tenant` now (adaptive; None in static mode)."""
        return round(self.retention_s(tenant, now), 3) if self.adaptive else None

    def taken(self, key: bytes, tenant: str, now: float) -> None:
        """A turn of the conversation under `key` arrived: its lease ends here (the turn holds
        the handle), and the gap since its handle was filed is learned."""
        if not self.adaptive:
            return
        lease = self.ledger.pop(key, now)
        if lease is not None:
            self.learner.observe(tenant, now - lease.filed_at, now)
            return
        gap = self.ledger.returned(key, now)  # it came back after its handle was released
        if gap is not None:
            self.learner.observe(tenant, gap, now)

    def superseded(self, handle: Handle, reason: str) -> None:
        """`handle` (taken by a turn) will never be offered: release D's blocks now, in a
        task of its own (the turn does not wait; its handler may be cancelled once the client
        has its answer, which must not cancel the release: vLLM's TTL would hold the blocks).
        In both modes: a handle the turn declined or found useless holds D's memory for
        nothing."""
        rid = _rid_or_none(handle)
        if rid is not None:
            self._spawn(self._release_quietly(handle.decode_url, rid, reason))

    # -- the sweeper ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Forever (until cancelled): release due and over-budget leases every second."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                if self.adaptive:
                    await self.sweep(self._clock())
                self._metrics.retained_blocks.set(self.ledger.held_blocks())
                self._metrics.retention_seconds.set(self.retention_s(None, self._clock()))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Retention sweep failed")

    async def sweep(self, now: float) -> None:
        """Release the leases past their deadline, then those over D's memory budget (the
        soonest due first), each only once its handle is taken out of the store."""
        await self._reclaim(self.ledger.due(now), "expired", now)
        fraction = self._config.tuning.decode_memory_budget
        for url, total in self._decoders().items():
            if total:
                over = self.ledger.over_budget(url, total, fraction, self._p_holds)
                await self._reclaim(over, "budget", now)
        for lease, at_least_s in self.ledger.censored(now):  # released, and never came back
            self.learner.observe_censored(lease.tenant, at_least_s, now)

    async def _reclaim(self, leases: list[Lease], reason: Reason, now: float) -> None:
        by_url: dict[str, list[Lease]] = {}
        for lease in leases:
            self.ledger.pop(lease.key, now)  # before any await: a new lease of the key stays
            if self._no_control_until.get(lease.decode_url, 0.0) > now:
                continue  # D offers no control: its TTL frees the blocks
            by_url.setdefault(lease.decode_url, []).append(lease)
        for url, batch in by_url.items():
            mine: list[tuple[Lease, Handle | None]] = []
            for lease in batch:
                releasable, handle = await self._take(lease, now)
                if releasable:
                    mine.append((lease, handle))
            if not mine:
                continue
            done = await self._release_ids(url, [lease.request_id for lease, _ in mine], reason)
            if done is None:  # certainly not released: the handles stay usable until expiry
                for lease, handle in mine:
                    if handle is not None:
                        await self._put_back(lease.key, handle, now)
                continue
            # Released (or may be): a return is learned from the tombstone, and the handle
            # stays for the continue path (D's prefix cache), never again for P.
            for lease, handle in mine:
                self.ledger.tombstone(lease, now)
                if handle is not None and self._config.tuning.reuse_released:
                    await self._put_back(lease.key, replace(handle, released=True), now)

    async def _take(self, lease: Lease, now: float) -> tuple[bool, Handle | None]:
        """Take the lease's handle out of the store: (releasable, the handle to put back if
        the release certainly did not happen). Not releasable: a turn holds it, or the store
        holds a newer handle under the key (put back; left to D's TTL)."""
        try:
            status, handle = await self._store.take(lease.key, now)
        except Exception as exc:
            self._metrics.store_errors.labels("take").inc()
            log.warning("Store take failed", extra={"error": repr(exc)})
            return False, None
        if status == "expired":
            return True, None  # gone from the store: nobody can take it any more
        if handle is None:
            return False, None  # a turn holds it (or it was evicted): not the sweeper's
        if _rid_or_none(handle) != lease.request_id:
            await self._put_back(lease.key, handle, now)
            return False, None
        return True, handle

    async def _release_quietly(self, url: str, rid: str, reason: str) -> None:
        await self._release_ids(url, [rid], reason)

    async def _release_ids(self, url: str, ids: list[str], reason: str) -> bool | None:
        """Ask D to release `ids`: True done, False may have been done, None certainly not."""
        try:
            released, _unknown = await self._client.release(url, ids)
        except LeaseFailure as exc:
            self._metrics.lease_errors.labels("release").inc()
            if exc.no_control:
                self._no_control_until[url] = self._clock() + NO_CONTROL_S
            log.warning(
                "Lease release failed",
                extra={"engine": url, "reason": reason, "error": str(exc), "leases": len(ids)},
            )
            return False if exc.maybe_done else None
        self._no_control_until.pop(url, None)
        if released:
            self._metrics.leases_released.labels(reason).inc(len(released))
        return True

    async def _put_back(self, key: bytes, handle: Handle, now: float) -> None:
        try:
            await self._store.restore(key, handle, now)
        except Exception:
            self._metrics.store_errors.labels("restore").inc()

    # -- what a client asks for (both modes) -------------------------------------------------

    async def end(self, key: bytes) -> bool:
        """The client ended the conversation: take its handle and release D's blocks. False
        when there was no handle to end."""
        now = self._clock()
        lease = self.ledger.pop(key, now)
        status, handle = await self._store.take(key, now)
        if handle is None:
            if status == "expired" and lease is not None:  # D may still hold it: free it
                await self._release_ids(lease.decode_url, [lease.request_id], "ended")
            return status == "expired" and lease is not None
        rid = _rid_or_none(handle)
        if rid is not None:
            await self._release_ids(handle.decode_url, [rid], "ended")
        return True

    async def renew(self, key: bytes, tenant: str, seconds: float | None) -> Renewed | None:
        """Renew D's lease of the conversation's handle (up to D's ceiling) and put the handle
        back with its new deadline. None: no handle, or D no longer holds its blocks. Raises
        LeaseFailure when D did not renew (the handle is back unchanged: still valid)."""
        now = self._clock()
        lease = self.ledger.pop(key, now)
        _, handle = await self._store.take(key, now)
        if handle is None:
            return None
        rid = _rid_or_none(handle)
        if rid is None:  # none, or released: D has nothing to renew
            await self._put_back(key, handle, now)
            return None
        # A renewal is a client's hint like any other, capped as one.
        ttl = self._config.decoder_blocks_ttl_s
        ceiling = hints.ceiling_s(self._config.tuning.retention_max_client_s, ttl)
        asked = min(ceiling, ttl if seconds is None else seconds)
        try:
            answer = await self._client.renew(handle.decode_url, [rid], asked)
        except LeaseFailure:
            self._metrics.lease_errors.labels("renew").inc()
            await self._put_back(key, handle, now)  # a renewal never shortens: still valid
            if lease is not None:
                self.ledger.add(lease, now)
            raise
        if rid not in answer.renewed:
            return None  # D no longer holds the blocks: the handle is void, dropped
        self._metrics.leases_renewed.inc()
        granted = min(asked, answer.ceiling_s)
        expires = max(handle.expires_at, now + min(default_handle_ttl(granted), self._ceiling_s))
        renewed = replace(handle, expires_at=expires, params=_with_expiry(handle, answer, rid))
        await self._put_back(key, renewed, now)
        if self.adaptive:  # the client asked to keep it: the sweeper leaves it until then
            blocks = block_count(renewed.kv_params())
            probe = lease.p_probe if lease is not None else None
            renewed_lease = Lease(key, handle.decode_url, rid, blocks, now, expires, tenant, probe)
            self.ledger.add(renewed_lease, now)
        return Renewed(max(0.0, expires - now))

    # -- state, lifecycle ------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What `/boomerang/v1/state` reports of retention."""
        now = self._clock()
        known = {url: total for url, total in self._decoders().items() if total}
        held_known = sum(self.ledger.held_blocks(url) for url in known)
        total = sum(known.values())
        return {
            state.RETENTION_S: round(self.retention_s(None, now), 3),
            state.RETAINED_BLOCKS: self.ledger.held_blocks(),
            state.RETAINED_FRACTION: round(held_known / total, 4) if total else None,
            state.RETAINED_BLOCK_SECONDS: round(self.ledger.block_seconds(now), 1),
            state.LEASES: len(self.ledger),
        }

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Let the releases under way finish (they are short and bounded by a timeout)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _rid_or_none(handle: Handle) -> str | None:
    """The request whose blocks D pins for the handle (None: none, its params are unreadable,
    or its lease was released: D pins nothing for it any more)."""
    if handle.released:
        return None
    try:
        return request_id_of(handle.kv_params())
    except ValueError:
        return None


def _with_expiry(handle: Handle, answer: Renewal, rid: str) -> bytes:
    """The handle's params with D's new deadline (P declines a pull near it)."""
    params = handle.kv_params()
    params["remote_blocks_expiry_time"] = answer.renewed[rid]
    return params_codec.pack(params)
