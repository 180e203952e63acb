"""What the flow tells retention about a conversation's handles, as a small protocol.

Why it exists: the flow (`flow.py`) and the lease I/O (`leases.Retention`, which releases and
renews D's blocks through the engines' lease API) are written apart; the flow only needs these
six calls, so it depends on this protocol, and a router built without retention (tests, the
bench, `static` mode's exact old behaviour) gets `NoRetention`, which does nothing.

When the flow calls each one:
- `taken`: a turn of the conversation under `key` arrived (its handle, if any, was just taken
  from the store): the gap since the last turn can be observed.
- `filed`: D's new handle for the conversation was stored under `key`; `replaced` is the
  handle that put replaced (the store's `put` returns it atomically: it was in the store, so
  no turn holds it), None when it replaced none; `hint_s` the client's retention hint, already
  capped (`hints.py`), which stands in for the learned retention of its lease.
- `learned_s`: the retention learned for the tenant now (None: nothing learned applies), for
  the turn's log line.
- `superseded`: `handle` will never be offered again and no turn holds it (it was taken from
  the store first): D's blocks can be released now, in the background (the turn never waits
  for D's answer, and a handler cancelled after its answer must not cancel it). Reasons:
  `recompute` (the turn computes on P without it), `superseded` (a continued turn's D
  answered with a fresh handle, or the handle was rejected: nothing in it is usable for the
  conversation any more).
- `run`: a background task for the app's lifetime; `state`: merged into `Router.state()`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from boomerang.router.conversation import Handle


class RetentionHooks(Protocol):
    """The calls the flow makes (see the module docstring); `leases.Retention` implements it."""

    def filed(
        self,
        key: bytes,
        handle: Handle,
        tenant: str,
        now: float,
        *,
        replaced: Any = None,
        hint_s: float | None = None,
        p_probe: int | None = None,
    ) -> None: ...

    def taken(self, key: bytes, tenant: str, now: float) -> None: ...

    def learned_s(self, tenant: str, now: float) -> float | None: ...

    def superseded(self, handle: Handle, reason: str) -> None: ...

    async def run(self) -> None: ...

    def state(self) -> dict[str, Any]: ...


class NoRetention:
    """Retention that does nothing: D keeps every handle's blocks for its TTL, as before."""

    def filed(
        self,
        key: bytes,
        handle: Handle,
        tenant: str,
        now: float,
        *,
        replaced: Any = None,
        hint_s: float | None = None,
        p_probe: int | None = None,
    ) -> None:
        return None

    def taken(self, key: bytes, tenant: str, now: float) -> None:
        return None

    def learned_s(self, tenant: str, now: float) -> float | None:
        return None

    def superseded(self, handle: Handle, reason: str) -> None:
        return None

    async def run(self) -> None:
        await asyncio.Event().wait()  # nothing to do, for as long as the app runs

    def state(self) -> dict[str, Any]:
        return {}
