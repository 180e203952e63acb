"""What D retains for the next turn, which of it a router has claimed, and what yields first.

Why: with bidirectional transfer D pins the blocks of every finished request until P reads
them, the router releases them, or the decoder TTL ends. Pinned blocks are not evictable, so
once they fill D's KV cache a new request cannot get blocks: an incoming P->D transfer waits
("KV fetch: waiting to start") and a request D serves alone cannot start, for as long as the
TTL. Retained blocks are a bet on a next turn; live work is certain. So when D cannot allocate,
retained leases yield, least valuable first, until the request fits (`pressure.py` does the
I/O inside vLLM; this module is the bookkeeping and the choice, pure and tested alone).

Releasing blocks that P is reading, or will read, would let them be overwritten under the read:
P would compute on another request's KV and nobody would notice. D cannot see a read coming
(NIXL reads are one-sided), so the router *claims* a lease before it offers the handle to P
(`claim`: D answers which leases it still holds and promises not to release those under
pressure), and offers only what D confirmed. A claimed lease yields only to its normal ends
(P's read, the router's release, the TTL). A lease released under pressure answers "gone" to
every later claim, so a router never offers it.

Least valuable first: the earliest deadline, then the oldest. The deadline is the router's own
hint: an adaptive router renews the leases it values and lets the others run out, and in static
mode every lease's deadline is its finish time plus the TTL, so the oldest goes first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class Lease:
    """One finished request whose blocks D keeps for a later read."""

    request_id: str
    finished_at: float
    deadline: float
    claimed: bool = False
    releasing: bool = False
    """Chosen to yield; its release is on its way to the workers (not yet freed)."""
    released_at: float = 0.0


@dataclass
class RetainedBook:
    """D's retained leases, kept by the scheduler process (one per engine)."""

    leases: dict[str, Lease] = field(default_factory=dict)
    released_total: int = 0
    """Leases that yielded to live work since the engine started."""
    released_blocks_total: int = 0
    pressure_events: int = 0
    """Scheduler steps in which a request could not get blocks while D held leases."""
    queued: list[str] = field(default_factory=list)
    """Leases asked to yield now (`yield_unclaimed`), for the next step's metadata."""

    def retained(self, request_id: str, finished_at: float, deadline: float) -> None:
        self.leases[request_id] = Lease(request_id, finished_at, deadline)

    def prune(self, alive: Callable[[str], bool]) -> None:
        """Forget leases whose blocks were freed (read, released, expired)."""
        for rid in [r for r in self.leases if not alive(r)]:
            del self.leases[rid]

    def claim(self, request_ids: Iterable[str]) -> dict[str, list[str]]:
        """Claim each lease D still holds and has not chosen to release: `held` ones may be
        offered to P (they will not yield to pressure); `gone` ones must not be."""
        held, gone = [], []
        for rid in request_ids:
            lease = self.leases.get(rid)
            if lease is None or lease.releasing:
                gone.append(rid)
                continue
            lease.claimed = True
            held.append(rid)
        return {"held": held, "gone": gone}

    def unclaim(self, request_ids: Iterable[str]) -> list[str]:
        """The router will not offer these after all (its turn did not reach P)."""
        done = []
        for rid in request_ids:
            lease = self.leases.get(rid)
            if lease is not None and lease.claimed:
                lease.claimed = False
                done.append(rid)
        return done

    def hint(self, deadlines: Mapping[str, float]) -> None:
        """New deadlines from the router's renewals (the order in which leases yield)."""
        for rid, deadline in deadlines.items():
            if (lease := self.leases.get(rid)) is not None:
                lease.deadline = deadline

    def yielding(self, shortfall: int, freeable: Callable[[str], int], now: float) -> list[str]:
        """Leases to release so that `shortfall` more blocks come free: unclaimed ones, least
        valuable first, counting the blocks already on their way (leases released earlier
        whose blocks the scheduler has not freed yet). `freeable(rid)` is how many blocks a
        release frees (blocks no running request shares). Marks the chosen as releasing at
        `now` (the scheduler's clock)."""
        coming = sum(freeable(rid) for rid, lease in self.leases.items() if lease.releasing)
        need = shortfall - coming
        if need <= 0:
            return []
        self.pressure_events += 1
        order = sorted(
            (lease for lease in self.leases.values() if not (lease.claimed or lease.releasing)),
            key=lambda lease: (lease.deadline, lease.finished_at),
        )
        chosen: list[str] = []
        for lease in order:
            if need <= 0:
                break
            blocks = freeable(lease.request_id)
            if blocks <= 0:
                continue  # a running request shares all of it: releasing frees nothing
            lease.releasing, lease.released_at = True, now
            chosen.append(lease.request_id)
            self.released_total += 1
            self.released_blocks_total += blocks
            need -= blocks
        return chosen

    def yield_unclaimed(self, now: float) -> list[str]:
        """Every unclaimed lease yields at the next step (asked for: an operator freeing D's
        memory, a benchmark starting clean); claimed ones stay for the reads under way."""
        ids = [r for r, lease in self.leases.items() if not (lease.claimed or lease.releasing)]
        for rid in ids:
            self.leases[rid].releasing, self.leases[rid].released_at = True, now
        self.queued.extend(ids)
        return ids

    def take_queued(self) -> list[str]:
        ids, self.queued = self.queued, []
        return ids

    def state(self, blocks_of: Callable[[str], int]) -> dict[str, int]:
        """What `GET /boomerang/v1/leases` and the engine's metrics report."""
        return {
            "retained": len(self.leases),
            "retained_blocks": sum(blocks_of(rid) for rid in self.leases),
            "claimed": sum(1 for lease in self.leases.values() if lease.claimed),
            "pressure_released": self.released_total,
            "pressure_released_blocks": self.released_blocks_total,
            "pressure_events": self.pressure_events,
        }


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size) if block_size > 0 else 0
