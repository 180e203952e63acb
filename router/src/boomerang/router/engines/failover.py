"""Trying one engine call on a role's engines in turn, and what ends the turn instead.

Why it exists: tokenize, prefill, decode and a turn on one engine alone all retry the same way,
so the policy is written once: an engine that failed retryably is counted (and ejected after
`eject_after_failures`) and the call goes to another engine of the role not yet tried for the
turn; a 4xx is the request's fault (another engine would say the same) and goes back to the
client with the engine's message; when no engine is left the turn gets `Unavailable` (503 when
none was tried, 504 after a timeout, else 502), which the flow may answer by serving the turn
on the other role alone (`degraded.py`). What a failure means for the turn's handle is the
call's own business (`Turn.spend`, `Turn.unsent`).

An engine's 5xx answer, or an error it reports in-band before the first token (kind
`status`), is the engine's fault or the request's (vLLM answers 500 to inputs it fails on, and
one client's request must not take the engine, and every tenant's handles on it, away from
everyone): it counts towards ejecting the engine only once another engine of the role served
the same call. A 5xx from every engine tried is the request's doing and ejects none
(`request_caused_failures`). Refused connections, timeouts and broken answers count at once: a
request cannot cause those.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import orjson

from boomerang.router.engines.endpoints import Endpoint, Pool, Role
from boomerang.router.engines.upstream import UpstreamError
from boomerang.router.errors import ApiError
from boomerang.router.metrics import Metrics

log = logging.getLogger("boomerang.router")
T = TypeVar("T")


class Unavailable(ApiError):
    """No engine of `role` could serve this turn: none was there, or every one tried failed
    (the flow may then serve the turn on the other role alone, see `degraded.py`)."""

    def __init__(self, role: Role, status: int, message: str, *, type_: str | None = None) -> None:
        super().__init__(status, message, type_=type_)
        self.role: Role = role


def unavailable(role: Role, last: UpstreamError | None) -> Unavailable:
    """No engine of a role could serve: 503 with none tried, 504 on timeouts, else 502."""
    detail = f": {last.kind}" if last is not None else ""
    status = 504 if last is not None and last.kind == "timeout" else 502
    if last is None:
        status = 503
    return Unavailable(role, status, f"no {role} engine could serve the request{detail}")


def client_error(exc: UpstreamError) -> ApiError:
    """An engine's 4xx, passed on with its own message when it has one."""
    try:
        message = _error_message(exc.body)
    except ValueError:
        message = None
    return ApiError(exc.status or 400, message or "the engine rejected the request")


def _error_message(body: bytes | None) -> str | None:
    """The `message` of an OpenAI-style error body, if there is one."""
    if not body:
        return None
    data = orjson.loads(body)
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return None


class Failover:
    """Runs a call on the engines of a role until one answers (one per app)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def run(
        self,
        pool: Pool,
        pick: Callable[[Sequence[Endpoint]], Endpoint],
        call: Callable[[Endpoint], Awaitable[T]],
        *,
        retries: int,
        first: Endpoint | None = None,
        before_retry: Callable[[UpstreamError], Awaitable[None]] | None = None,
    ) -> T:
        """`call` on `first` (else the engine `pick` chooses), then on up to `retries` other
        engines of `pool` (`before_retry` runs before each, given the last failure).

        Raises ApiError for an engine's 4xx, `Unavailable` when no engine is left."""
        tried: set[str] = set()
        last: UpstreamError | None = None
        answered_5xx: list[tuple[Endpoint, UpstreamError]] = []
        for attempt in range(1 + retries):
            ep = first if attempt == 0 and first is not None else self._next(pool, pick, tried)
            if ep is None:
                break
            if last is not None:
                self.metrics.retries.labels(pool.role).inc()
                if before_retry is not None:
                    await before_retry(last)
            tried.add(ep.url)
            try:
                result = await call(ep)
            except UpstreamError as exc:
                last = exc
                if exc.kind == "status":  # the engine's or the request's: known once another
                    answered_5xx.append((ep, exc))  # engine serves the call, or none does
                    self._log(pool, ep, exc)
                    continue
                self.failed(pool, ep, exc)
                if not exc.retryable:
                    raise client_error(exc) from None
            else:
                for failed_ep, failure in answered_5xx:  # another engine served it: theirs
                    self.failed(pool, failed_ep, failure, logged=True)
                return result
        if answered_5xx:
            self.metrics.request_caused.labels(pool.role).inc(len(answered_5xx))
        raise unavailable(pool.role, last)

    @staticmethod
    def _next(
        pool: Pool, pick: Callable[[Sequence[Endpoint]], Endpoint], tried: set[str]
    ) -> Endpoint | None:
        candidates = pool.candidates(tried)
        return pick(candidates) if candidates else None

    def failed(self, pool: Pool, ep: Endpoint, exc: UpstreamError, logged: bool = False) -> None:
        """Count and log a failed call; a retryable one counts towards ejecting the engine."""
        if exc.retryable:
            self.metrics.upstream_failures.labels(pool.role, exc.kind).inc()
            if pool.failed(ep):
                self.metrics.ejections.labels(pool.role).inc()
                log.warning("Ejected engine", extra={"role": pool.role, "engine": ep.url})
        if not logged:
            self._log(pool, ep, exc)

    @staticmethod
    def _log(pool: Pool, ep: Endpoint, exc: UpstreamError) -> None:
        log.warning(
            "Engine call failed",
            extra={"role": pool.role, "engine": ep.url, "kind": exc.kind, "error": str(exc)},
        )
