"""D's retained leases yield to live work, least valuable first, and never when claimed: the
book (`retained.py`) and its hooks into vLLM's scheduler and workers (`pressure.py`) on
stand-ins of vLLM 0.32's objects."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from boomerang.connector.plugin import leases, pressure
from boomerang.connector.plugin.retained import RetainedBook, blocks_for

NOW = 0.0


def book(**deadlines: float) -> RetainedBook:
    b = RetainedBook()
    for i, (rid, deadline) in enumerate(deadlines.items()):
        b.retained(rid, finished_at=float(i), deadline=deadline)
    return b


def test_the_earliest_deadline_yields_first_until_the_shortfall_is_covered() -> None:
    b = book(old=10.0, renewed=500.0, mid=100.0)
    assert b.yielding(5, lambda rid: 4, NOW) == ["old", "mid"]
    assert b.released_total == 2 and b.released_blocks_total == 8 and b.pressure_events == 1


def test_blocks_already_on_their_way_count_and_nothing_more_yields_for_them() -> None:
    b = book(a=1.0, b=2.0)
    assert b.yielding(3, lambda rid: 4, NOW) == ["a"]
    assert b.yielding(3, lambda rid: 4, NOW) == []  # a's 4 blocks are coming free
    assert b.yielding(7, lambda rid: 4, NOW) == ["b"]


def test_claimed_leases_and_those_sharing_every_block_never_yield() -> None:
    b = book(claimed=1.0, shared=2.0, free=3.0)
    assert b.claim(["claimed", "gone"]) == {"held": ["claimed"], "gone": ["gone"]}
    assert b.yielding(100, lambda rid: 0 if rid == "shared" else 1, NOW) == ["free"]


def test_a_lease_chosen_to_yield_is_gone_to_a_later_claim() -> None:
    b = book(a=1.0)
    assert b.yielding(1, lambda rid: 1, NOW) == ["a"]
    assert b.claim(["a"]) == {"held": [], "gone": ["a"]}


def test_unclaim_and_prune_and_hint() -> None:
    b = book(a=1.0, b=2.0)
    b.claim(["a"])
    assert b.unclaim(["a", "zzz"]) == ["a"]
    b.hint({"a": 99.0})
    assert b.yielding(1, lambda rid: 1, NOW) == ["b"]
    b.prune(lambda rid: rid == "a")
    assert list(b.leases) == ["a"]


@pytest.mark.parametrize(
    ("running", "free", "needed", "missing"),
    [(0, 10, 4, 0), (0, 3, 4, 1), (8, 10, 0, 0), (8, 5, 0, 3), (8, 5, 4, 7)],
)
def test_headroom_keeps_a_block_per_running_request_and_what_a_newcomer_needs(
    running, free, needed, missing
) -> None:
    assert pressure.headroom(running, free, needed) == missing


def test_blocks_for_rounds_up() -> None:
    assert [blocks_for(n, 128) for n in (0, 1, 128, 129)] == [0, 1, 1, 2]


# --- the hooks, on stand-ins of vLLM's scheduler, KV cache manager and NIXL worker -----------


class Pool:
    def __init__(self, total: int) -> None:
        self.blocks = {i: SimpleNamespace(ref_cnt=0) for i in range(total)}

    def get_num_free_blocks(self) -> int:
        return sum(1 for b in self.blocks.values() if b.ref_cnt == 0)


class Manager:
    """Allocates whole requests of `tokens // 4` blocks (block size 4) or fails."""

    def __init__(self, total: int) -> None:
        self.block_pool = Pool(total)
        self.owned: dict[str, list[int]] = {}

    def allocate_slots(self, request: Any, num_new_tokens: int, **kwargs: Any) -> Any:
        need = blocks_for(request.num_tokens, 4)
        free = [i for i, b in self.block_pool.blocks.items() if b.ref_cnt == 0 and i]
        if len(free) < need:
            return None
        for i in free[:need]:
            self.block_pool.blocks[i].ref_cnt = 1
        self.owned[request.request_id] = free[:need]
        return free[:need]

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return (self.owned[request_id],)


class Scheduler:
    def __init__(self, manager: Manager, waiting: list[Any]) -> None:
        self.running: list[Any] = []
        self.kv_cache_manager = manager
        self.block_size = 4
        self.requests: dict[str, Any] = {}
        self.connector = SimpleNamespace(connector_scheduler=SimpleNamespace())
        self.waiting = waiting

    def schedule(self) -> Any:
        for request in list(self.waiting):
            if self.kv_cache_manager.allocate_slots(request, request.num_tokens) is None:
                break
            self.waiting.remove(request)
        return SimpleNamespace(kv_connector_metadata=SimpleNamespace())


def retain(scheduler: Scheduler, rid: str, tokens: int, deadline: float) -> None:
    req = SimpleNamespace(request_id=rid, num_tokens=tokens)
    assert scheduler.kv_cache_manager.allocate_slots(req, tokens) is not None
    scheduler.requests[rid] = req
    pressure.book_of(scheduler.connector.connector_scheduler).retained(rid, deadline, deadline)


def test_a_request_that_cannot_get_blocks_names_the_leases_that_yield() -> None:
    manager = Manager(total=9)  # block 0 is vLLM's null block: 8 usable
    newcomer = SimpleNamespace(request_id="new", num_tokens=16)  # 4 blocks
    scheduler = Scheduler(manager, [newcomer])
    retain(scheduler, "old", 12, deadline=1.0)  # 3 blocks
    retain(scheduler, "young", 12, deadline=2.0)  # 3 blocks: 2 free left
    schedule = pressure.wrap_schedule(Scheduler.schedule)
    out = schedule(scheduler)
    assert getattr(out.kv_connector_metadata, pressure.RELEASE_ATTR) == ["old"]
    again = schedule(scheduler)  # old's blocks are on their way: nothing more yields
    assert not hasattr(again.kv_connector_metadata, pressure.RELEASE_ATTR)


def test_the_worker_releases_what_the_step_names_as_the_router_would() -> None:
    worker = SimpleNamespace(
        _reqs_to_send={"old": 1e12, "young": 1e12},
        _reqs_to_process={"old", "young"},
        consumer_notification_counts_by_req={},
        expected_consumer_notifications_by_req={},
        _reap_expired_send_leases=lambda done: None,
    )
    seen = []
    start = pressure.wrap_start_load_kv(lambda self, metadata: seen.append(metadata))
    metadata = SimpleNamespace(**{pressure.RELEASE_ATTR: ["old"]})
    start(worker, metadata)
    assert seen == [metadata] and list(worker._reqs_to_send) == ["young"]
    done: set[str] = set()
    worker._reap_expired_send_leases(done)
    assert done == {"old"}
    assert leases.release(worker, ["old"])["unknown"] == ["old"]


def test_d_records_a_lease_only_for_blocks_it_keeps_for_a_read() -> None:
    owner = SimpleNamespace()
    kept = {"do_remote_decode": True, "remote_blocks_expiry_time": 42.0}
    answers = iter([(True, kept), (True, {"do_remote_prefill": True}), (False, None)])
    finished = pressure.wrap_request_finished(lambda self, request, block_ids: next(answers))
    for rid in ("d-kept", "p-sent", "freed"):
        finished(owner, SimpleNamespace(request_id=rid), ([1],))
    leases_ = pressure.book_of(owner).leases
    assert list(leases_) == ["d-kept"] and leases_["d-kept"].deadline == 42.0


def test_hooks_stay_off_without_the_lease_token() -> None:
    assert pressure.enabled({}) is False
    assert pressure.apply({}) is False
    assert pressure.enabled({"BOOMERANG_LEASE_TOKEN": "t"}) is True


def test_yield_unclaimed_queues_every_unclaimed_lease_for_the_next_step() -> None:
    b = book(a=1.0, b=2.0, c=3.0)
    b.claim(["b"])
    assert b.yield_unclaimed(NOW) == ["a", "c"]
    assert b.take_queued() == ["a", "c"] and b.take_queued() == []
    assert b.claim(["a", "b"]) == {"held": ["b"], "gone": ["a"]}


def test_running_requests_keep_headroom_before_they_would_be_preempted() -> None:
    manager = Manager(total=9)  # 8 usable
    scheduler = Scheduler(manager, [])
    retain(scheduler, "old", 12, deadline=1.0)  # 3 blocks
    retain(scheduler, "young", 12, deadline=2.0)  # 3 blocks: 2 free
    scheduler.running = [object()] * 4  # four decodes, each may need a block next step
    out = pressure.wrap_schedule(Scheduler.schedule)(scheduler)
    assert getattr(out.kv_connector_metadata, pressure.RELEASE_ATTR) == ["old"]
