"""How long a handle is worth keeping, and the leases the router believes D holds (pure).

Kept apart from the lease I/O (`leases.py`) so the estimator and the bookkeeping are tested
alone, with synthetic clocks.

`GapLearner` learns the gap between a conversation's turns, per deployment and per tenant. It
keeps a histogram on log-spaced buckets (40 a decade, 0.1 s to one day: gaps are heavy-tailed,
so relative precision matters at every scale, and a bucket is 6% wide before interpolation),
with exponential forgetting in wall time (old traffic fades with `half_life_s`), in constant
memory per tenant and O(buckets) per quantile. Some observations are right-censored: a released
conversation that did not come back within `at_least_s` says only that its gap is longer.
Dropping those would bias the estimate low (long gaps are exactly the ones that get cut short),
so the quantile comes from a Kaplan-Meier estimate over the buckets (events before censoring
within a bucket). It is the quantile among the conversations that come back: the mass the
estimate leaves beyond the longest gap seen is the conversations that never return, and keeping
a handle for them is pure waste. So the quantile stays within the range of observed gaps and is
monotone in q (log-linear interpolation within a bucket). It ends where fewer than 0.1% of the
observations are still followed: after heavy censoring the last few returns would otherwise take
all the remaining mass (which costs the far tail a little: q 0.99 of log-normal gaps reads as
about q 0.989).

For a released conversation file exactly one observation: its exact gap when it comes back
(`Ledger.returned`), or a censored one when it did not within the tombstone horizon
(`Ledger.censored`). Measuring returns past the router's own retention is what lets the learned
retention grow again after it was cut; censoring at the release time instead would ratchet it
down.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

_LO_S: Final = 0.1
_PER_DECADE: Final = 40
_BUCKETS: Final = math.ceil(math.log10(86_400.0 / _LO_S) * _PER_DECADE)
_EDGES: Final = tuple(_LO_S * 10 ** (i / _PER_DECADE) for i in range(_BUCKETS + 1))
_MIN_AT_RISK: Final = 0.001
"""The estimate ends where fewer than this share of the observations are still followed."""
_RESCALE: Final = 64.0
"""Weights grow as 2**(age / half-life) instead of decaying; rescaled past this exponent."""


def _bucket(seconds: float) -> int:
    if seconds <= _LO_S:
        return 0
    return min(_BUCKETS - 1, int(math.log10(seconds / _LO_S) * _PER_DECADE))


class _Histogram:
    """Decayed event (exact) and censored weights per bucket; the observed range of events."""

    __slots__ = ("censored", "event_weight", "events", "hi", "lo", "t0")

    def __init__(self, now: float) -> None:
        self.events = [0.0] * _BUCKETS
        self.censored = [0.0] * _BUCKETS
        self.event_weight = 0.0
        self.t0 = now
        self.lo, self.hi = math.inf, 0.0

    def add(self, seconds: float, exact: bool, now: float, half_life_s: float) -> None:
        age = (now - self.t0) / half_life_s
        if age > _RESCALE:
            f = math.exp2(-age)
            self.events = [w * f for w in self.events]
            self.censored = [w * f for w in self.censored]
            self.event_weight *= f
            self.t0, age = now, 0.0
        w = math.exp2(max(age, -_RESCALE))
        if exact:
            self.events[_bucket(seconds)] += w
            self.event_weight += w
            self.lo, self.hi = min(self.lo, seconds), max(self.hi, seconds)
        else:
            self.censored[_bucket(seconds)] += w

    def samples(self, now: float, half_life_s: float) -> float:
        """Exact gaps seen, decayed to `now`."""
        return self.event_weight * math.exp2(-(now - self.t0) / half_life_s)

    def quantile(self, q: float) -> float | None:
        mass = self._km_mass()
        total = sum(mass)
        if total <= 0:
            return None
        target, cum = q * total, 0.0
        for i, m in enumerate(mass):
            if m > 0 and cum + m >= target:
                frac = min(1.0, max(0.0, (target - cum) / m))
                t = _EDGES[i] * math.pow(_EDGES[i + 1] / _EDGES[i], frac)
                return min(self.hi, max(self.lo, t))
            cum += m
        return self.hi

    def _km_mass(self) -> list[float]:
        """Kaplan-Meier probability mass of a return in each bucket."""
        at_risk = sum(self.events) + sum(self.censored)
        survival, mass, least = 1.0, [0.0] * _BUCKETS, _MIN_AT_RISK * at_risk
        for i in range(_BUCKETS):
            d = self.events[i]
            if at_risk <= least:
                break  # too few followed this long: the few returns left say nothing
            if d > 0:
                mass[i] = survival * min(1.0, d / at_risk)
                survival -= mass[i]
            at_risk -= d + self.censored[i]
        return mass


class GapLearner:
    """The gap between a conversation's turns, per deployment and per tenant (module docs).

    A tenant's own estimate is used once it has `min_tenant_samples` (decayed) exact gaps,
    else the deployment's once it has `min_samples`; before that `quantile` is None. Tenant
    None or "" is the deployment only. At most `max_tenants` tenants are kept (the least
    recently observed is forgotten)."""

    def __init__(
        self,
        *,
        half_life_s: float = 3600.0,
        min_tenant_samples: int = 20,
        min_samples: int = 20,
        max_tenants: int = 10_000,
    ) -> None:
        if not (half_life_s > 0 and max_tenants >= 0):
            raise ValueError("need half_life_s > 0 and max_tenants >= 0")
        self._half_life_s = half_life_s
        self._min_tenant, self._min = min_tenant_samples, min_samples
        self._max_tenants = max_tenants
        self._all: _Histogram | None = None
        self._tenants: OrderedDict[str, _Histogram] = OrderedDict()

    def observe(self, tenant: str | None, gap_s: float, now: float) -> None:
        """An exact gap: the conversation's next turn came `gap_s` after the last answer."""
        self._add(tenant, gap_s, True, now)

    def observe_censored(self, tenant: str | None, at_least_s: float, now: float) -> None:
        """The conversation did not come back within `at_least_s`."""
        self._add(tenant, at_least_s, False, now)

    def quantile(self, tenant: str | None, q: float, now: float) -> float | None:
        """The q-quantile of the gap (seconds) for `tenant`, falling back to the deployment;
        None until enough samples."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q}")
        mine = self._tenants.get(tenant) if tenant else None
        for h, least in ((mine, self._min_tenant), (self._all, self._min)):
            if h is not None and h.samples(now, self._half_life_s) >= least:
                value = h.quantile(q)
                if value is not None:
                    return value
        return None

    def samples(self, tenant: str | None, now: float) -> float:
        """Decayed exact gaps seen for `tenant` (None: the deployment)."""
        h = self._tenants.get(tenant) if tenant else self._all
        return 0.0 if h is None else h.samples(now, self._half_life_s)

    def _add(self, tenant: str | None, seconds: float, exact: bool, now: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0 and math.isfinite(now)):
            return
        if self._all is None:
            self._all = _Histogram(now)
        self._all.add(seconds, exact, now, self._half_life_s)
        if not tenant or self._max_tenants == 0:
            return
        h = self._tenants.get(tenant)
        if h is None:
            h = self._tenants[tenant] = _Histogram(now)
            if len(self._tenants) > self._max_tenants:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(tenant)
        h.add(seconds, exact, now, self._half_life_s)


@dataclass(frozen=True, slots=True)
class RetentionBounds:
    """The operator's bounds on retention (router config `tuning`)."""

    quantile: float = 0.9
    min_s: float = 10.0
    ceiling_s: float = 400.0
    """D's handle TTL: never longer."""

    def __post_init__(self) -> None:
        if not (0.0 < self.quantile < 1.0 and self.min_s >= 0 and 0 < self.ceiling_s < math.inf):
            raise ValueError(f"need 0 < quantile < 1, min_s >= 0, finite ceiling_s > 0: {self}")


def retention_s(learned: float | None, bounds: RetentionBounds) -> float:
    """How long to keep a handle: the ceiling until learned (like static), else the learned
    gap clamped to [min_s, ceiling_s] (the ceiling wins when min_s exceeds it)."""
    if learned is None or not math.isfinite(learned):
        return bounds.ceiling_s
    return min(bounds.ceiling_s, max(bounds.min_s, learned))


@dataclass(slots=True)
class Lease:
    """A handle whose blocks the router believes D holds for it."""

    key: bytes
    decode_url: str
    request_id: str
    """D's engine request id (the handle's remote_request_id): the lease API's name for it."""
    blocks: int
    filed_at: float
    deadline: float
    """When the router releases it unless a turn takes it first."""
    tenant: str
    p_probe: int | None = None
    """The KV index's hash of the last whole block of the prompt P computed for it (None: no
    index): while a prefill engine still holds that block, losing the lease costs little."""


class Ledger:
    """The leases the router believes D holds, per conversation key; their block-seconds; and
    the tombstones of released ones (module docs), kept `tombstone_s` after filing.

    Methods taking `now` advance the block-seconds integral; `add` without `now` counts from
    the lease's `filed_at`, `pop` without `now` stops counting at the latest time seen."""

    def __init__(self, *, tombstone_s: float = 3600.0, max_tombstones: int = 50_000) -> None:
        self._tombstone_s, self._max_tombstones = tombstone_s, max_tombstones
        self._leases: dict[bytes, Lease] = {}
        self._held: dict[str, int] = {}
        self._total = 0
        self._integral, self._t = 0.0, -math.inf
        self._tombstones: OrderedDict[bytes, Lease] = OrderedDict()
        self._evicted: list[tuple[Lease, float]] = []

    def add(self, lease: Lease, now: float | None = None) -> Lease | None:
        """File `lease`; returns the lease it replaces under that key (superseded). The
        conversation came back, so a tombstone under the key is dropped."""
        self._advance(lease.filed_at if now is None else now)
        old = self._remove(lease.key)
        self._tombstones.pop(lease.key, None)
        self._leases[lease.key] = lease
        self._count(lease, lease.blocks)
        return old

    def pop(self, key: bytes, now: float | None = None) -> Lease | None:
        if now is not None:
            self._advance(now)
        return self._remove(key)

    def get(self, key: bytes) -> Lease | None:
        return self._leases.get(key)

    def __len__(self) -> int:
        return len(self._leases)

    def due(self, now: float) -> list[Lease]:
        """The leases past their deadline, soonest first."""
        self._advance(now)
        return sorted((x for x in self._leases.values() if x.deadline <= now), key=_deadline)

    def over_budget(
        self,
        decode_url: str,
        total_blocks: int,
        fraction: float,
        p_holds: Callable[[int], bool] | None = None,
    ) -> list[Lease]:
        """The leases of `decode_url` to release so that what it holds is <= fraction *
        total_blocks (none while the total is unknown, <= 0).

        First those whose history a prefill engine still holds (`p_holds` of their `p_probe`:
        P recomputes from its own cache what they would bring), soonest deadline first: they
        cost no tenant anything. Then, fairly between tenants, from whichever holds the most
        blocks on this decoder at that point, its soonest deadline first: so no tenant keeps
        its conversations by crowding out another's (a client's long retention hint, say,
        whose deadline is always the latest). What is kept is what P forgot, which only a pull
        brings back cheaply, shared out as evenly as the tenants' own holdings allow."""
        excess = self.held_blocks(decode_url) - fraction * total_blocks
        if total_blocks <= 0 or excess <= 0:
            return []
        mine = sorted(
            (x for x in self._leases.values() if x.decode_url == decode_url), key=_deadline
        )
        on_p = [x for x in mine if p_holds and x.p_probe is not None and p_holds(x.p_probe)]
        cheap = {id(x) for x in on_p}
        queues: dict[str, list[Lease]] = {}
        held: dict[str, int] = {}
        for lease in mine:
            held[lease.tenant] = held.get(lease.tenant, 0) + lease.blocks
            if id(lease) not in cheap:
                queues.setdefault(lease.tenant, []).append(lease)
        out: list[Lease] = []
        for lease in on_p:
            if excess <= 0:
                return out
            out.append(lease)
            excess -= lease.blocks
            held[lease.tenant] -= lease.blocks
        while excess > 0 and queues:
            tenant = max(queues, key=lambda t: (held[t], t))  # the largest holder gives next
            lease = queues[tenant].pop(0)
            if not queues[tenant]:
                del queues[tenant]
            out.append(lease)
            excess -= lease.blocks
            held[tenant] -= lease.blocks
        return out

    def held_blocks(self, decode_url: str | None = None) -> int:
        return self._total if decode_url is None else self._held.get(decode_url, 0)

    def block_seconds(self, now: float) -> float:
        """The integral of held blocks over time so far."""
        self._advance(now)
        return self._integral

    def tombstone(self, lease: Lease, now: float) -> None:
        """`lease` was released: remember it, to learn its gap should its conversation return."""
        self._advance(now)
        self._tombstones.pop(lease.key, None)
        self._tombstones[lease.key] = lease
        while len(self._tombstones) > self._max_tombstones:
            _, old = self._tombstones.popitem(last=False)
            self._evicted.append((old, max(0.0, now - old.filed_at)))

    def returned(self, key: bytes, now: float) -> float | None:
        """A released lease's conversation came back: its gap (for the learner), else None."""
        self._advance(now)
        lease = self._tombstones.pop(key, None)
        return None if lease is None else max(0.0, now - lease.filed_at)

    def censored(self, now: float) -> list[tuple[Lease, float]]:
        """Tombstones whose conversation did not return within the horizon (or that were
        evicted for room), with the gap they are known to exceed; each is reported once."""
        self._advance(now)
        out, self._evicted = self._evicted, []
        for key, lease in list(self._tombstones.items()):
            if now - lease.filed_at >= self._tombstone_s:
                del self._tombstones[key]
                out.append((lease, now - lease.filed_at))
        return out

    def _remove(self, key: bytes) -> Lease | None:
        lease = self._leases.pop(key, None)
        if lease is not None:
            self._count(lease, -lease.blocks)
        return lease

    def _count(self, lease: Lease, blocks: int) -> None:
        self._total += blocks
        held = self._held.get(lease.decode_url, 0) + blocks
        if held:
            self._held[lease.decode_url] = held
        else:
            self._held.pop(lease.decode_url, None)

    def _advance(self, t: float) -> None:
        if t > self._t:
            if math.isfinite(self._t):
                self._integral += self._total * (t - self._t)
            self._t = t


def _deadline(lease: Lease) -> float:
    return lease.deadline
