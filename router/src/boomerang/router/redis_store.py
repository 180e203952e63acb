"""The shared store for several router replicas: handles in Redis, taken atomically.

`take` is one GETDEL (Redis >= 6.2), so two replicas serving two turns of one conversation can
never both get the handle. The key TTL (handle TTL plus the grace period in which an expired
handle is still counted as expired) is Redis' own, so nothing needs sweeping and a crashed
replica leaks nothing. `restore` is SET NX with the remaining TTL: it never overwrites a newer
handle. `put` is SET with GET (Redis >= 6.2), so it says atomically which handle it replaced.
Errors propagate; the flow counts them and treats the turn as a miss (never fails it).
"""

from __future__ import annotations

import math
import time

import redis.asyncio as aioredis

from boomerang.router.conversation import Handle
from boomerang.router.store import EXPIRED_GRACE_S, TakeStatus


class RedisStore:
    """ConversationStore over one Redis (or a Redis-protocol service)."""

    def __init__(self, url: str, key_prefix: str, *, timeout_s: float = 1.0) -> None:
        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._prefix = key_prefix.encode()

    def _name(self, key: bytes) -> bytes:
        return self._prefix + key.hex().encode()

    async def take(self, key: bytes, now: float) -> tuple[TakeStatus, Handle | None]:
        handle = _decoded(await self._redis.getdel(self._name(key)))
        if handle is None:
            return "missing", None
        if handle.expires_at <= now:
            return "expired", None
        return "found", handle

    async def put(self, key: bytes, handle: Handle) -> Handle | None:
        old = await self._redis.set(
            self._name(key), handle.encode(), px=_ttl_ms(handle, None), get=True
        )
        return None if isinstance(old, bool) else _decoded(old)

    async def restore(self, key: bytes, handle: Handle, now: float) -> None:
        if handle.expires_at > now:
            await self._redis.set(
                self._name(key), handle.encode(), px=_ttl_ms(handle, now), nx=True
            )

    async def size(self) -> int | None:
        return None

    def sweep(self, now: float) -> int:
        return 0

    async def close(self) -> None:
        await self._redis.aclose()


def _decoded(raw: bytes | str | None) -> Handle | None:
    """A stored handle, or None (absent, or not a handle this version can read)."""
    if raw is None:
        return None
    try:
        return Handle.decode(raw if isinstance(raw, bytes) else raw.encode("latin-1"))
    except ValueError:
        return None


def _ttl_ms(handle: Handle, now: float | None) -> int:
    current = time.time() if now is None else now
    ms: int = math.ceil((handle.expires_at - current + EXPIRED_GRACE_S) * 1000)
    return max(1, ms)
