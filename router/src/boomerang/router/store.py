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
- A stored handle comes back exactly as it was filed, block hashes included (the memory store
  packs each into one bytes object; Redis keeps `Handle.encode`'s JSON).
"""

from __future__ import annotations

import itertools
import struct
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

    async def put(self, key: bytes, handle: Handle) -> Handle | None:
        """File `handle` under `key`, replacing any older one; returns the one it replaced
        (atomically: a handle returned here was in the store, so no turn held it)."""
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


_HEADER = struct.Struct("<dIIBHI?")
"""expires_at, num_tokens, block_size, the lengths of the prefix hash, the decode URL and the
params, and whether D released the blocks; then those three, then the block hashes (the
rest)."""
_EXPIRES = struct.Struct("<d")


def _pack(h: Handle) -> bytes:
    """A Handle as one bytes object: no per-field objects, and bytes are invisible to CPython's
    GC (100k stored conversations as objects made every full collection scan them, about
    25 ms a pass)."""
    url = h.decode_url.encode("utf-8", "surrogatepass")
    head = _HEADER.pack(
        h.expires_at,
        h.num_tokens,
        h.block_size,
        len(h.prefix_hash),
        len(url),
        len(h.params),
        h.released,
    )
    return b"".join((head, h.prefix_hash, url, h.params, h.block_hashes))


def _unpack(blob: bytes) -> Handle:
    expires_at, n, size, digest_len, url_len, params_len, released = _HEADER.unpack_from(blob)
    at = _HEADER.size
    digest, at = blob[at : at + digest_len], at + digest_len
    url, at = blob[at : at + url_len].decode("utf-8", "surrogatepass"), at + url_len
    params, hashes = blob[at : at + params_len], blob[at + params_len :]
    return Handle(params, digest, n, url, expires_at, size, hashes, released)


def _expires_at(blob: bytes) -> float:
    value: float = _EXPIRES.unpack_from(blob)[0]
    return value


EVICT_FRACTION = 64
"""At the bound, the oldest 1/64 of `max_conversations` go at once (see `MemoryStore.put`)."""


class MemoryStore:
    """One router replica: a plain dict of packed handles, in filing order (oldest first).

    A dict keeps insertion order at half an OrderedDict's cost per entry (about 50 bytes of
    100k conversations' 1 KB each). Its oldest entries are found by iterating from its front,
    which also walks the slots of entries deleted there since the dict last resized: so
    eviction and sweeping each make one pass per batch, never one per entry.
    """

    def __init__(self, max_conversations: int) -> None:
        self._items: dict[bytes, bytes] = {}
        self._max = max_conversations

    async def take(self, key: bytes, now: float) -> tuple[TakeStatus, Handle | None]:
        blob = self._items.pop(key, None)
        if blob is None:
            return "missing", None
        if _expires_at(blob) <= now:
            return "expired", None
        return "found", _unpack(blob)

    async def put(self, key: bytes, handle: Handle) -> Handle | None:
        """File `handle` as the newest entry; beyond the bound, drop the oldest ones (1/64 of
        the bound at once, so that a full store does not rescan its front on every put)."""
        old = self._items.pop(key, None)  # a replaced entry moves to the end: it is the newest
        self._items[key] = _pack(handle)
        excess = len(self._items) - self._max
        if excess > 0:
            self._drop_oldest(excess + self._max // EVICT_FRACTION)
        return None if old is None else _unpack(old)

    def _drop_oldest(self, count: int) -> None:
        for key in list(itertools.islice(self._items, count)):
            del self._items[key]

    async def restore(self, key: bytes, handle: Handle, now: float) -> None:
        if key not in self._items and handle.expires_at > now:
            await self.put(key, handle)

    async def size(self) -> int | None:
        return len(self._items)

    def sweep(self, now: float) -> int:
        """Entries are in filing order and share one TTL, so expired ones are at the front."""
        expired = 0
        for blob in self._items.values():
            if _expires_at(blob) + EXPIRED_GRACE_S > now:
                break
            expired += 1
        self._drop_oldest(expired)
        return expired

    async def close(self) -> None:
        self._items.clear()
