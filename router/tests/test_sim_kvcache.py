"""The simulator's KV blocks: conservation, LRU eviction from the tail, pinned blocks kept."""

from __future__ import annotations

import random

import pytest
from boomsim.kvcache import CACHED, IN_USE, PINNED, BlockPool


def test_blocks_are_conserved_through_random_use() -> None:
    rng = random.Random(7)
    pool = BlockPool(200)
    state: dict[int, int] = {}
    for _ in range(5000):
        conv = rng.randrange(30)
        op = state.get(conv)
        if op is None:
            if pool.acquire(conv, rng.randint(1, 60), lambda _: None):
                state[conv] = IN_USE
        elif op == IN_USE:
            pin = rng.random() < 0.3
            pool.release(conv, rng.randint(0, pool.held(conv)), pin=pin)
            state[conv] = PINNED if pin else CACHED
            if conv not in pool.items:
                del state[conv]
        elif op == PINNED:
            pool.unpin(conv)
            state[conv] = CACHED
        for c in [c for c in state if c not in pool.items]:
            del state[c]  # evicted
        pool.check()
    assert pool.evicted > 0, "the sequence never filled the pool: it tested nothing"


def test_eviction_takes_the_least_recently_used_conversation_from_its_tail() -> None:
    pool = BlockPool(10)
    for conv in (1, 2):
        assert pool.acquire(conv, 5)
        pool.release(conv, 5)
    assert pool.acquire(3, 3)
    assert pool.held(1) == 2 and pool.held(2) == 5  # 1 was used first: 3 of its 5 blocks went
    pool.check()


def test_pinned_and_running_blocks_are_never_evicted() -> None:
    pool = BlockPool(10)
    assert pool.acquire(1, 6)
    pool.release(1, 6, pin=True)
    assert pool.acquire(2, 4)
    assert not pool.acquire(3, 1)
    assert pool.held(1) == 6 and pool.held(2) == 4 and 3 not in pool.items
    pool.check()


def test_a_yield_callback_frees_pinned_blocks_when_eviction_is_short() -> None:
    pool = BlockPool(10)
    assert pool.acquire(1, 8)
    pool.release(1, 8, pin=True)
    asked: list[int] = []

    def yielder(shortfall: int) -> None:
        asked.append(shortfall)
        pool.unpin(1)

    assert pool.acquire(2, 5, yielder)
    assert asked == [3]
    assert pool.held(1) == 5  # unpinned into the cache, then 3 evicted from its tail
    pool.check()


@pytest.mark.parametrize("caching", [True, False])
def test_without_prefix_caching_nothing_stays_after_a_request(caching: bool) -> None:
    pool = BlockPool(10, caching=caching)
    assert pool.acquire(1, 4)
    pool.release(1, 4)
    assert pool.held(1) == (4 if caching else 0)
    assert pool.free == (6 if caching else 10)
    pool.check()


def test_the_cpu_tier_keeps_the_longest_prompt_and_evicts_the_least_recently_used() -> None:
    from boomsim.kvcache import CpuTier

    tier = CpuTier(capacity=1000)
    tier.put(1, 400)
    tier.put(2, 400)
    tier.put(1, 300)  # a shorter prompt never replaces a longer one
    assert tier.get(1) == 400 and tier.used == 800
    tier.put(3, 400)  # over capacity: 2 is the least recently used (1 was just read)
    assert tier.get(2) == 0 and tier.get(1) == 400 and tier.get(3) == 400
    assert tier.used == 800 and tier.evicted == 400
    tier.put(4, 2000)  # larger than the tier: not stored, nothing evicted for it
    assert tier.get(4) == 0 and tier.used == 800


def test_the_blocks_held_for_someone_are_integrated_over_time() -> None:
    """In use or pinned counts, cached does not: 100 blocks in use for 2 s, 40 of them pinned
    for 3 s more, then cached for 5 s: (200 + 120) block-seconds of 1,000 blocks over 10 s."""
    now = [0.0]
    pool = BlockPool(1000, clock=lambda: now[0])
    pool.acquire(1, 100)
    now[0] = 2.0
    pool.release(1, 40, pin=True)
    now[0] = 5.0
    pool.unpin(1)
    now[0] = 10.0
    assert pool.held_share(10.0) == pytest.approx(320 / 10_000)
    pool.check()
