"""Bookkeeping after an answer runs to its end, even when the client leaves meanwhile.

Why it exists: the router runs with aiohttp's handler cancellation on, so that a client that
goes away while a turn is in flight stops the engine calls made for it (D stops generating).
But the client may also go away just after its answer is complete (many clients close the
connection at `[DONE]`), while the handler still files D's new handle in the store or puts
an unused one back. Cancelled there, a Redis `put` dies half-way and the conversation loses
its reuse (or its handle) for a reason that has nothing to do with the turn. What follows the
answer is therefore awaited through `settle`, which lets it finish and then lets the handler
finish too: the answer is out, nothing is left to stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def settle(work: Awaitable[T]) -> T:
    """Await `work` to its end. A cancellation of the calling task meanwhile is absorbed
    (`Task.uncancel`) once `work` is done; one of `work` itself is raised."""
    inner = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        if inner.cancelled():
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return await inner
