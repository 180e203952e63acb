"""Engine endpoints, their health and load, and the (replaceable) selection strategy.

An endpoint is one engine pod's base URL. Its state is what the router observed: in-flight
requests and outstanding work (estimated prompt tokens), consecutive failures (ejected after
`eject_after_failures`, brought back by the health prober), and capabilities (vLLM version,
whether streamed responses carry kv_transfer_params). Discovery replaces the URL set; state of
surviving URLs is kept.

Selection is a small strategy object so it can be replaced: the default sends prefill to the
least outstanding work and keeps a conversation on the decode pod that holds its history (its
prefix cache shrinks the P->D transfer) unless that pod is `slack` requests busier than the
least loaded one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol

Role = Literal["prefill", "decode"]


@dataclass(eq=False)
class Endpoint:
    """One engine as the router sees it."""

    url: str
    role: Role
    inflight: int = 0
    work: float = 0.0
    failures: int = 0
    ejected: bool = False
    lost_at: float = 0.0
    """Wall clock of the last ejection. An engine that went away may have restarted and lost
    its KV: handles made before this naming it are void (see `Flow._claim`)."""
    probed_ok: bool = False
    successes_since_eject: int = 0
    version: str | None = None
    stream_params: bool | None = None
    """Whether D's streamed final chunk carries kv_transfer_params (None: not known yet)."""
    stream_params_at: float = 0.0

    @property
    def ready(self) -> bool:
        """Answered a health probe and is not ejected."""
        return self.probed_ok and not self.ejected


@dataclass
class Pool:
    """The endpoints of one role."""

    role: Role
    eject_after: int = 3
    readmit_after: int = 1
    endpoints: dict[str, Endpoint] = field(default_factory=dict)

    def set_urls(self, urls: Sequence[str]) -> None:
        """Replace the URL set (from discovery), keeping the state of URLs that remain."""
        wanted = list(dict.fromkeys(u.rstrip("/") for u in urls))
        self.endpoints = {u: self.endpoints.get(u) or Endpoint(u, self.role) for u in wanted}

    def get(self, url: str | None) -> Endpoint | None:
        """The endpoint with this URL, if it is still known."""
        return self.endpoints.get(url) if url else None

    def candidates(self, exclude: set[str] | None = None) -> list[Endpoint]:
        """Usable endpoints; when all are ejected, the ejected ones (better than failing)."""
        exclude = exclude or set()
        pool = [e for e in self.endpoints.values() if e.url not in exclude]
        healthy = [e for e in pool if not e.ejected]
        return healthy or pool

    def ready_count(self) -> int:
        """Endpoints that passed a probe and are not ejected."""
        return sum(1 for e in self.endpoints.values() if e.ready)

    def failed(self, ep: Endpoint) -> bool:
        """Record a failure; returns True when this ejected the endpoint."""
        ep.failures += 1
        ep.successes_since_eject = 0
        if not ep.ejected and ep.failures >= self.eject_after:
            ep.ejected = True
            ep.lost_at = time.time()
            return True
        return False

    def succeeded(self, ep: Endpoint, *, probe: bool = False) -> None:
        """Record a success; a probe success readmits an ejected endpoint."""
        ep.failures = 0
        if probe:
            ep.probed_ok = True
            if ep.ejected:
                ep.successes_since_eject += 1
                if ep.successes_since_eject >= self.readmit_after:
                    ep.ejected = False
                    ep.successes_since_eject = 0

    @contextmanager
    def track(self, ep: Endpoint, work: float) -> Iterator[None]:
        """Count a request against the endpoint's load while it runs."""
        ep.inflight += 1
        ep.work += work
        try:
            yield
        finally:
            ep.inflight -= 1
            ep.work -= work


class Strategy(Protocol):
    """Chooses engines; must be cheap and must not do I/O."""

    def prefill(self, candidates: Sequence[Endpoint]) -> Endpoint:
        """The prefill engine for a turn (candidates is never empty)."""
        ...

    def decode(self, candidates: Sequence[Endpoint], holder: str | None) -> Endpoint:
        """The decode engine; `holder` is the URL of the D holding the conversation, if any."""
        ...


class LeastWorkAffinity:
    """Least outstanding work for P; decode affinity with an overload escape for D."""

    def __init__(self, slack: int = 4) -> None:
        self.slack = slack
        self._ticks = {"prefill": itertools.count(), "decode": itertools.count()}

    def _least(self, candidates: Sequence[Endpoint], key_work: bool) -> Endpoint:
        # Rotate the starting point so ties spread evenly instead of piling on the first.
        start = next(self._ticks[candidates[0].role]) % len(candidates)
        ordered = list(candidates[start:]) + list(candidates[:start])
        if key_work:
            return min(ordered, key=lambda e: (e.work, e.inflight))
        return min(ordered, key=lambda e: (e.inflight, e.work))

    def prefill(self, candidates: Sequence[Endpoint]) -> Endpoint:
        return self._least(candidates, key_work=True)

    def decode(self, candidates: Sequence[Endpoint], holder: str | None) -> Endpoint:
        least = self._least(candidates, key_work=False)
        for ep in candidates:
            if ep.url == holder and ep.inflight <= least.inflight + self.slack:
                return ep
        return least
