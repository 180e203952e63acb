"""Load shedding: a cap on the client requests one router replica serves at once.

Why: past some concurrency more turns only queue (in the engines, in this process's memory, on
its CPU) and every turn in flight gets slower. Answering `429` with `Retry-After` at once, before
the body is read and before any engine is called, keeps the replica's memory bounded and lets
the client (the OpenAI SDKs retry a 429 after `Retry-After`) or a load balancer go elsewhere.

Only the completion endpoints take a slot: `/health`, `/ready`, `/metrics` and `/v1/models` are
never limited, so probes and scrapes keep answering under load. A slot is held from admission
until the handler returns (for a streamed answer: until the stream ended). The check is a
counter compare on the event loop: no lock is needed, nothing awaits in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from boomerang.router.errors import ApiError


class Overloaded(ApiError):
    """The replica is at its in-flight limit: 429 with `Retry-After`."""


class InflightLimit:
    """Counts the requests being served; refuses one beyond `limit` (0: unlimited)."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.current = 0

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot for the block; raises `Overloaded` when none is free."""
        if self.limit and self.current >= self.limit:
            raise Overloaded(
                429,
                f"this router replica is serving its limit of {self.limit} requests; "
                f"retry after {self.retry_after_s} s",
                type_="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.current += 1
        try:
            yield
        finally:
            self.current -= 1
