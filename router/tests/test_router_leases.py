"""Retention's I/O (`leases.Retention`) with a memory store and a scripted lease client.

Every branch that decides whether D's blocks are released: the static mode's no-ops, the
lease filed per handle, a superseded handle, the gap observed when a turn arrives, the sweeper
(releasing due leases only once their handle is out of the store, skipping one a turn holds,
putting back a newer handle), release failures (left to D's TTL, the handle put back only when
the release certainly did not happen), the decode-memory budget (soonest due first), and a
client ending or renewing a conversation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from boomerang.router import params_codec
from boomerang.router.config import RouterConfig
from boomerang.router.conversation import Handle, build_handle
from boomerang.router.metrics import Metrics
from boomerang.router.retention.leases import LeaseFailure, Renewal, Retention
from boomerang.router.store import MemoryStore

D = "http://d0"
NOW = 1_000_000.0


class FakeLeases:
    """The lease client, scripted: what D answers, and every call made."""

    def __init__(self) -> None:
        self.released: list[tuple[str, list[str]]] = []
        self.renewals: list[tuple[str, list[str], float]] = []
        self.failure: LeaseFailure | None = None
        self.held: set[str] = set()
        """Ids D holds: a renewal of another is unknown."""

    async def release(self, url: str, ids: list[str]) -> tuple[list[str], list[str]]:
        self.released.append((url, list(ids)))
        if self.failure is not None:
            raise self.failure
        return list(ids), []

    async def renew(self, url: str, ids: list[str], seconds: float) -> Renewal:
        self.renewals.append((url, list(ids), seconds))
        if self.failure is not None:
            raise self.failure
        known = [i for i in ids if i in self.held]
        return Renewal(
            {i: 5000.0 + seconds for i in known}, [i for i in ids if i not in known], 60.0
        )

    def ids(self) -> list[str]:
        return [i for _, batch in self.released for i in batch]


def config(mode: str = "adaptive", **tuning: Any) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "prefill": {"urls": ["http://p0"]},
            "decode": {"urls": [D]},
            "decoder_blocks_ttl_s": 60,
            "tuning": {"mode": mode, "retention_min_s": 1, **tuning},
        }
    )


def handle(rid: str, blocks: int = 2, url: str = D, expires: float = NOW + 40) -> Handle:
    params = {
        "do_remote_decode": True,
        "remote_block_ids": [list(range(blocks))],
        "remote_request_id": rid,
        "remote_num_tokens": blocks * 16,
        "remote_blocks_expiry_time": 123.0,
    }
    built = build_handle(params, list(range(blocks * 16)), url, expires)
    assert built is not None
    return built


class World:
    def __init__(
        self,
        mode: str = "adaptive",
        kv_blocks: int | None = None,
        p_holds: Callable[[int], bool] | None = None,
        **tuning: Any,
    ):
        self.config = config(mode, **tuning)
        self.store = MemoryStore(100)
        self.leases = FakeLeases()
        self.metrics = Metrics()
        self.clock = NOW
        self.retention = Retention(
            self.config,
            self.store,
            self.leases,  # type: ignore[arg-type]
            self.metrics,
            decoders=lambda: {D: kv_blocks},
            p_holds=p_holds,
            clock=lambda: self.clock,
        )

    async def file(
        self, key: bytes, h: Handle, tenant: str = "t", at: float | None = None, probe: int = 0
    ) -> None:
        replaced = await self.store.put(key, h)
        now = self.clock if at is None else at
        self.retention.filed(key, h, tenant, now, replaced=replaced, p_probe=probe or None)

    def counter(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def learn(self, gap_s: float, n: int = 40, tenant: str = "t") -> None:
        for _ in range(n):
            self.retention.learner.observe(tenant, gap_s, self.clock)


async def test_static_mode_keeps_no_lease_and_releases_only_what_a_turn_let_go() -> None:
    w = World(mode="static")
    await w.file(b"k", handle("r1"))
    await w.file(b"k", handle("r2"))  # replaced in the store: still D's TTL, as before
    w.retention.taken(b"k", "t", NOW + 5)
    await w.retention.sweep(NOW + 1000)
    assert len(w.retention.ledger) == 0 and w.leases.released == []
    assert (await w.store.take(b"k", NOW))[0] == "found"
    w.retention.superseded(handle("r3"), "recompute")  # a turn declined it: free it now
    await w.retention.close()
    assert w.leases.ids() == ["r3"]


async def test_a_filed_handle_is_leased_for_the_learned_gap_within_the_bounds() -> None:
    w = World()
    await w.file(b"k", handle("r1", blocks=3))
    lease = w.retention.ledger.get(b"k")
    assert lease is not None and (lease.request_id, lease.blocks) == ("r1", 3)
    assert lease.deadline == NOW + 40  # nothing learned: the handle's own deadline (ceiling)
    w.learn(5.0)
    await w.file(b"k2", handle("r2"))
    lease = w.retention.ledger.get(b"k2")
    assert lease is not None and NOW + 4 < lease.deadline < NOW + 6
    w.learn(0.2, n=400)
    await w.file(b"k3", handle("r3"))
    lease = w.retention.ledger.get(b"k3")
    assert lease is not None and lease.deadline == NOW + 1  # retention_min_s


async def test_a_superseded_handle_is_released_at_once_unless_it_is_the_same_request() -> None:
    w = World()
    await w.file(b"k", handle("r1"))
    await w.file(b"k", handle("r1"))  # the same D request filed again: nothing to free
    await w.file(b"k", handle("r2"))
    await w.retention.close()  # the release runs as a task
    assert w.leases.released == [(D, ["r1"])]
    assert w.counter("boomerang_router_leases_released_total", reason="superseded") == 1


async def test_a_replaced_handle_not_provably_in_the_store_is_left_to_d() -> None:
    """A turn may hold the old handle (its take and our filing raced, or another replica's turn
    took it): only a store that says it replaced exactly that handle proves nobody holds it."""
    w = World()
    w.retention.filed(b"k", handle("r1"), "t", NOW, replaced=None)
    w.retention.filed(b"k", handle("r2"), "t", NOW, replaced=None)
    w.retention.filed(b"k", handle("r3"), "t", NOW, replaced=handle("other"))
    await w.retention.close()
    assert w.leases.released == []


async def test_a_turn_ends_the_lease_and_its_gap_is_learned() -> None:
    w = World()
    await w.file(b"k", handle("r1"))
    w.retention.taken(b"k", "t", NOW + 7)
    assert len(w.retention.ledger) == 0
    assert w.retention.learner.samples("t", NOW + 7) == pytest.approx(1, rel=0.01)
    w.retention.taken(b"unknown", "t", NOW + 8)  # nothing filed: nothing learned
    assert w.retention.learner.samples("t", NOW + 8) == pytest.approx(1, rel=0.01)


async def test_the_sweeper_takes_a_due_handle_out_releases_it_and_learns_a_return() -> None:
    w = World()
    w.learn(2.0)
    await w.file(b"k", handle("r1"))
    await w.retention.sweep(NOW + 1)  # not due yet
    assert w.leases.released == []
    await w.retention.sweep(NOW + 3)
    assert w.leases.released == [(D, ["r1"])]
    status, back = await w.store.take(b"k", NOW + 3)  # back, for D's prefix cache only
    assert status == "found" and back is not None and back.released
    assert back == dataclasses.replace(handle("r1"), released=True)
    assert len(w.retention.ledger) == 0  # no lease: D pins nothing for it
    assert w.counter("boomerang_router_leases_released_total", reason="expired") == 1
    before = w.retention.learner.samples("t", NOW + 20)
    w.retention.taken(b"k", "t", NOW + 20)  # it came back after all: the exact gap
    assert w.retention.learner.samples("t", NOW + 20) == pytest.approx(before + 1, rel=0.01)


async def test_without_reuse_of_released_handles_a_released_one_is_gone() -> None:
    w = World(reuse_released=False)
    w.learn(2.0)
    await w.file(b"k", handle("r1"))
    await w.retention.sweep(NOW + 3)
    assert w.leases.released == [(D, ["r1"])]
    assert (await w.store.take(b"k", NOW + 3))[0] == "missing"  # never offered again


async def test_a_released_handle_is_never_leased_released_or_renewed_again() -> None:
    w = World()
    soft = dataclasses.replace(handle("r1"), released=True)
    await w.file(b"k", soft)  # put back unused by a turn: still no lease
    assert len(w.retention.ledger) == 0
    w.retention.superseded(soft, "superseded")
    await w.retention.close()
    assert await w.retention.renew(b"k", "t", None) is None
    assert await w.retention.end(b"k") is True  # ended: gone from the store, D not asked
    assert w.leases.released == [] and w.leases.renewals == []


async def test_the_sweeper_skips_a_handle_a_turn_holds() -> None:
    w = World()
    w.learn(2.0)
    await w.file(b"k", handle("r1"))
    await w.store.take(b"k", NOW)  # a turn took it (and will spend, restore or supersede it)
    await w.retention.sweep(NOW + 3)
    assert w.leases.released == [] and len(w.retention.ledger) == 0


async def test_the_sweeper_puts_back_a_newer_handle_it_did_not_lease() -> None:
    w = World()
    w.learn(2.0)
    await w.file(b"k", handle("r1"))
    await w.store.put(b"k", handle("r9"))  # another replica filed a newer one
    await w.retention.sweep(NOW + 3)
    assert w.leases.released == []
    status, back = await w.store.take(b"k", NOW + 3)
    assert status == "found" and back is not None and back.kv_params()["remote_request_id"] == "r9"


async def test_a_handle_expired_in_the_store_is_still_released_at_d() -> None:
    w = World()
    await w.file(b"k", handle("r1", expires=NOW + 2))
    await w.retention.sweep(NOW + 50)
    assert w.leases.released == [(D, ["r1"])]


@pytest.mark.parametrize(
    ("failure", "put_back"),
    [
        (LeaseFailure("refused", maybe_done=False, no_control=False), True),
        (LeaseFailure("HTTP 401", maybe_done=False, no_control=True), True),
        (LeaseFailure("HTTP 500", maybe_done=True, no_control=False), False),
    ],
    ids=["unreachable", "no control", "failed after sending"],
)
async def test_a_failed_release_is_counted_and_left_to_d(
    failure: LeaseFailure, put_back: bool
) -> None:
    """Never retried in a loop; the handle is offered to P again only when D certainly kept
    it (else it is back as released: only the continue path may use it)."""
    w = World()
    w.learn(2.0)
    w.leases.failure = failure
    await w.file(b"k", handle("r1"))
    await w.retention.sweep(NOW + 3)
    assert w.counter("boomerang_router_lease_errors_total", op="release") == 1
    assert len(w.retention.ledger) == 0  # no second try
    status, back = await w.store.take(b"k", NOW + 3)
    assert status == "found" and back is not None  # whole, or for D's prefix cache only
    assert back.released is not put_back
    await w.retention.sweep(NOW + 10)
    assert len(w.leases.released) == 1


async def test_a_decoder_without_control_is_not_asked_again_for_a_while() -> None:
    w = World()
    w.learn(2.0)
    w.leases.failure = LeaseFailure("HTTP 404", maybe_done=False, no_control=True)
    await w.file(b"k1", handle("r1"))
    await w.retention.sweep(NOW + 3)
    w.clock = NOW + 4
    await w.file(b"k2", handle("r2"))
    await w.retention.sweep(NOW + 7)
    assert len(w.leases.released) == 1  # r2 is left to D's TTL without a call
    assert (await w.store.take(b"k2", NOW + 7))[0] == "found"


async def test_over_the_memory_budget_the_soonest_due_leases_go_first() -> None:
    w = World(kv_blocks=10, decode_memory_budget=0.7)
    w.learn(20.0)
    for i, at in enumerate((NOW + 3, NOW + 1, NOW + 2)):  # deadlines follow the filing time
        await w.file(f"k{i}".encode(), handle(f"r{i}", blocks=2), at=at)
    await w.retention.sweep(NOW + 4)
    assert w.leases.released == []  # 6 blocks of 10: within the budget of 7
    await w.file(b"k3", handle("r3", blocks=2), at=NOW + 4)
    await w.file(b"k4", handle("r4", blocks=2), at=NOW + 4)
    await w.retention.sweep(NOW + 5)  # 10 > 7: release 2 leases, the soonest due first
    assert w.leases.ids() == ["r1", "r2"]
    assert w.counter("boomerang_router_leases_released_total", reason="budget") == 2
    assert w.retention.ledger.held_blocks(D) == 6
    state = w.retention.state()
    assert state["retained_blocks"] == 6 and state["retained_fraction"] == 0.6


async def test_over_the_memory_budget_what_p_still_holds_goes_first() -> None:
    """The same budget, with the KV index saying P still holds r2's and r3's histories: those
    go, though r0 and r1 are due sooner: theirs, which P forgot, stay on D for a pull."""
    w = World(kv_blocks=10, decode_memory_budget=0.7, p_holds={102, 103}.__contains__)
    w.learn(20.0)
    for i in range(5):
        await w.file(f"k{i}".encode(), handle(f"r{i}", blocks=2), at=NOW + i, probe=100 + i)
    await w.retention.sweep(NOW + 5)  # 10 > 7: release 2 leases
    assert sorted(w.leases.ids()) == ["r2", "r3"]
    assert w.retention.ledger.get(b"k0") is not None and w.retention.ledger.get(b"k1")


async def test_superseded_hands_over_a_taken_handle_for_release() -> None:
    w = World()
    w.retention.superseded(handle("r1"), "recompute")  # in the background: the turn goes on
    assert w.leases.released == []
    await w.retention.close()
    assert w.leases.released == [(D, ["r1"])]
    assert w.counter("boomerang_router_leases_released_total", reason="recompute") == 1


async def test_ending_a_conversation_releases_its_handle_in_either_mode() -> None:
    for mode in ("static", "adaptive"):
        w = World(mode=mode)
        await w.file(b"k", handle("r1"))
        assert await w.retention.end(b"k") is True
        assert w.leases.released == [(D, ["r1"])]
        assert (await w.store.take(b"k", NOW))[0] == "missing"
        assert await w.retention.end(b"k") is False
        assert len(w.retention.ledger) == 0


async def test_renewing_puts_the_handle_back_with_d_s_new_deadline() -> None:
    w = World()
    w.leases.held = {"r1"}
    await w.file(b"k", handle("r1", expires=NOW + 10))
    renewed = await w.retention.renew(b"k", "t", 50.0)
    assert renewed is not None
    # granted 50 s from now: the handle TTL rule takes P's decline window and a margin off
    assert renewed.expires_in_s == pytest.approx(50 - 5 - 5)
    status, back = await w.store.take(b"k", NOW)
    assert status == "found" and back is not None
    assert back.expires_at == pytest.approx(NOW + 40)
    assert back.kv_params()["remote_blocks_expiry_time"] == 5050.0
    assert back.kv_params()["remote_block_ids"] == [[0, 1]]
    lease = w.retention.ledger.get(b"k")
    assert lease is not None and lease.deadline == back.expires_at
    assert w.counter("boomerang_router_leases_renewed_total") == 1


async def test_a_renewal_never_shortens_and_defaults_to_the_ceiling() -> None:
    w = World()
    w.leases.held = {"r1"}
    await w.file(b"k", handle("r1", expires=NOW + 40))
    renewed = await w.retention.renew(b"k", "t", 11.0)
    assert renewed is not None and renewed.expires_in_s == pytest.approx(40)
    await w.retention.renew(b"k", "t", None)
    assert w.leases.renewals[-1][2] == 60.0  # the decoder TTL


async def test_a_renewal_is_capped_like_any_client_hint() -> None:
    """`tuning.retention_max_client_s` bounds what a client may ask, renewals included."""
    w = World(retention_max_client_s=20)
    w.leases.held = {"r1"}
    await w.file(b"k", handle("r1", expires=NOW + 5))
    await w.retention.renew(b"k", "t", 3600.0)
    assert w.leases.renewals[-1][2] == 20.0
    await w.retention.renew(b"k", "t", None)
    assert w.leases.renewals[-1][2] == 20.0


async def test_a_renewal_d_does_not_know_drops_the_handle() -> None:
    w = World()
    await w.file(b"k", handle("r1"))
    assert await w.retention.renew(b"k", "t", 30.0) is None
    assert (await w.store.take(b"k", NOW))[0] == "missing"
    assert await w.retention.renew(b"nothing", "t", 30.0) is None


async def test_a_failed_renewal_puts_the_handle_back_unchanged() -> None:
    w = World()
    w.leases.failure = LeaseFailure("HTTP 500", maybe_done=True, no_control=False)
    h = handle("r1")
    await w.file(b"k", h)
    with pytest.raises(LeaseFailure):
        await w.retention.renew(b"k", "t", 30.0)
    assert w.counter("boomerang_router_lease_errors_total", op="renew") == 1
    assert await w.store.take(b"k", NOW) == ("found", h)
    assert w.retention.ledger.get(b"k") is not None


def test_params_keep_the_expiry_field_through_the_codec() -> None:
    params = {
        "remote_request_id": "r",
        "remote_blocks_expiry_time": 12.5,
        "remote_block_ids": [[1]],
    }
    assert params_codec.unpack(params_codec.pack(params)) == params


async def test_the_sweep_loop_reports_what_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from boomerang.router.retention import leases

    monkeypatch.setattr(leases, "SWEEP_INTERVAL_S", 0.01)
    w = World()
    w.clock = time.time()
    await w.file(b"k", handle("r1", blocks=3, expires=w.clock + 40))
    task = asyncio.create_task(w.retention.run())
    await asyncio.sleep(0.1)
    task.cancel()
    assert w.counter("boomerang_router_retained_blocks") == 3
    assert w.counter("boomerang_router_retention_seconds") == pytest.approx(
        w.config.effective_handle_ttl_s
    )


async def test_a_client_s_hint_replaces_the_learned_gap_within_the_handle_ttl() -> None:
    w = World()
    w.learn(5.0)
    h = handle("r1")
    await w.store.put(b"k", h)
    w.retention.filed(b"k", h, "t", NOW, replaced=None, hint_s=30.0)
    lease = w.retention.ledger.get(b"k")
    assert lease is not None and lease.deadline == NOW + 30  # the hint, not the learned 5 s
    h2 = handle("r2")
    await w.store.put(b"k2", h2)
    w.retention.filed(b"k2", h2, "t", NOW, replaced=None, hint_s=3600.0)
    lease = w.retention.ledger.get(b"k2")
    assert lease is not None and lease.deadline == NOW + 40  # never past the handle's TTL
    sources = ("hint", "learned")
    counts = [
        w.counter("boomerang_router_lease_retention_seconds_count", source=s) for s in sources
    ]
    assert counts == [2, 0]
    assert w.retention.learned_s("t", NOW) is not None


async def test_a_hinted_lease_yields_to_d_s_memory_budget_like_any_other() -> None:
    w = World(kv_blocks=4, decode_memory_budget=0.5)
    for i in range(3):
        h = handle(f"r{i}", blocks=2)
        await w.store.put(f"k{i}".encode(), h)
        w.retention.filed(f"k{i}".encode(), h, "t", NOW, replaced=None, hint_s=35.0)
    await w.retention.sweep(NOW + 1)
    await w.retention.close()
    assert len(w.leases.ids()) == 2  # 6 blocks held, 2 allowed: the hint is no pin
