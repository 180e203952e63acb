"""Where handles live between turns: a small protocol, in memory or in Redis.

Rules every store keeps (the flow relies on them):
- `take` is atomic: of two concurrent turns of one conversation at most one gets the handle;
  the other sees `missing` and computes from scratch. A handle is therefore never shared.
- The flow consumes the taken handle only after P accepted it; when P certainly never
  received it (connection refused, tokenize failed) it `restore`s it, which never overwrites a
  newer handle filed meanwhile.
- Handles carry their own deadline (`expires_at`). Expired handles are kept for a grace period
  so a late turn can be counted as `expired` rather than `missing`, then dropped by a sweep
  (memory) or by Redis' own key TTL. Memory is bounded by `max_conversations` (oldest first).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal, Protocol

from boomerang.router.conversation import Handle

TakeStatus = Literal["found", "missing", "expired"]
EXPIRED_GRACE_S = 300.0
"""How long an expired handle is remembered, only to count it as expired."""


class ConversationStore(Protocol):
    """The store interface used by the flow."""

    async def take(self, key: bytes, now: float) -> tuple[TakeStatus, Handle | None]:
        """Atomically remove and return the handle under `key`."""
        ...

    async def put(self, key: bytes, handle: Handle) -> None:
        """File `handle` under `key`, replacing any older one."""
        ...

    async def restore(self, key: bytes, handle: Handle, now: float) -> None:
        """Put back a handle that was taken but never used, unless a newer one exists."""
        ...

    async def size(self) -> int | None:
        """Stored entries (None when the store cannot tell cheaply)."""
        ...

    def sweep(self, now: float) -> int:
        """Drop entries past their grace period; returns how many."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


_Packed = tuple[bytes, bytes, int, str, float]
"""A Handle's fields as a plain tuple of atoms, which CPython's GC stops tracking: 100k stored
conversations as objects made every full collection scan them (about 25 ms a pass)."""


class MemoryStore:
    """One router replica: an insertion-ordered dict, so the oldest entries are swept first."""

    def __init__(self, max_conversations: int) -> None:
        self._items: OrderedDict[bytes, _Packed] = OrderedDict()
        self._max = max_conversations

    async def take(self, key: bytes, now: float) -> tuple[TakeStatus, Handle | None]:
        packed = self._items.pop(key, None)
        if packed is None:
            return "missing", None
        if packed[4] <= now:
            return "expired", None
        return "found", Handle(*packed)

    async def put(self, key: bytes, handle: Handle) -> None:
        h = handle
        self._items[key] = (h.params, h.prefix_hash, h.num_tokens, h.decode_url, h.expires_at)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    async def restore(self, key: bytes, handle: Handle, now: float) -> None:
        if key not in self._items and handle.expires_at > now:
            await self.put(key, handle)

    async def size(self) -> int | None:
        return len(self._items)

    def sweep(self, now: float) -> int:
        """Entries are in filing order and share one TTL, so expired ones are at the front."""
        dropped = 0
        while self._items:
            key, packed = next(iter(self._items.items()))
            if packed[4] + EXPIRED_GRACE_S > now:
                break
            del self._items[key]
            dropped += 1
        return dropped

    async def close(self) -> None:
        self._items.clear()
