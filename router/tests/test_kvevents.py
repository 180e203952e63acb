"""The router's index follows an engine's KV events over real ZMQ sockets (`kvevents.py`),
against a stand-in of vLLM's publisher: stores and removals, what was stored before the router
came (replay), missed batches (asked for again), an engine restart, a cleared cache, and an
engine that hashes otherwise than the router (the index is then not used)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fake_kv_publisher import FakePublisher, removed, stored

from boomerang.router.config import KvEventsConfig
from boomerang.router.engines import blockhash
from boomerang.router.engines.kvevents import Index, KvEvents
from boomerang.router.metrics import Metrics

URL = "http://127.0.0.1:1000"
BS = 16
IDS = list(range(1, 65))  # four blocks
HASHES = blockhash.prompt_hashes(IDS, BS)


@pytest.fixture
async def engine() -> AsyncIterator[FakePublisher]:
    pub = FakePublisher()
    yield pub
    await pub.close()


def follow(pub: FakePublisher) -> tuple[Index, asyncio.Task[None], Metrics]:
    cfg = KvEventsConfig(port_offset=pub.pub_port - 1000, replay_port_offset=pub.replay_port - 1000)
    metrics = Metrics()
    index = Index(None, metrics)
    task = asyncio.create_task(KvEvents(cfg, index, lambda: [URL], metrics).run())
    return index, task, metrics


async def joined(pub: FakePublisher) -> tuple[Index, asyncio.Task[None]]:
    """An index following `pub` once connected (it asked for what came before) and its SUB
    socket has joined, so that what `pub` sends next arrives."""
    index, task, _ = follow(pub)
    await until(lambda: pub.replays)
    await asyncio.sleep(0.2)
    return index, task


async def until(check: Any, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def held(index: Index) -> int:
    return index.cached_tokens(index.hashes(IDS), [URL]).get(URL, 0)


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_stores_and_removals_are_followed(engine: FakePublisher) -> None:
    index, task = await joined(engine)
    await engine.send(stored(IDS, BS))
    await until(lambda: held(index) == 64)
    await engine.send(removed(HASHES[2:3]))  # evicting block 2 cuts the prefix there
    await until(lambda: held(index) == 32)
    await stop(task)


async def test_holds_names_a_block_any_of_the_engines_holds(engine: FakePublisher) -> None:
    """What retention asks (`Index.holds`): does any of these engines hold that block."""
    index, task = await joined(engine)
    await engine.send(stored(IDS, BS))
    await until(lambda: held(index) == 64)
    last = HASHES[-1]
    assert index.hashes(IDS) == HASHES
    assert index.holds(last, [URL]) and index.holds(last, ["http://other", URL])
    assert not index.holds(last, ["http://other"]) and not index.holds(last, [])
    await engine.send(removed(HASHES[-1:]))
    await until(lambda: not index.holds(last, [URL]))
    await stop(task)


async def test_a_router_started_later_learns_what_was_stored_before(engine) -> None:
    await engine.send(stored(IDS, BS))
    index, task, _ = follow(engine)
    await until(lambda: held(index) == 64)
    assert engine.replays == [0]
    await stop(task)


async def test_a_missed_batch_is_asked_for_again(engine: FakePublisher) -> None:
    index, task = await joined(engine)
    await engine.send(stored(IDS[:16], BS))
    await engine.send(stored(IDS[:32], BS, first=1), drop=True)  # never arrives
    await engine.send(removed([]))  # seq 2: the gap shows
    await until(lambda: held(index) == 32)
    assert 1 in engine.replays
    await stop(task)


async def test_a_restarted_engine_starts_empty(engine: FakePublisher) -> None:
    index, task = await joined(engine)
    await engine.send(stored(IDS, BS))
    await engine.send(removed([]))
    await until(lambda: held(index) == 64)
    engine.restart()
    await engine.send(stored(IDS[:16], BS))  # seq 0 again: the old cache is gone
    await until(lambda: held(index) == 16)
    await stop(task)


async def test_a_cleared_cache_is_forgotten(engine: FakePublisher) -> None:
    index, task = await joined(engine)
    await engine.send(stored(IDS, BS))
    await until(lambda: held(index) == 64)
    await engine.send({"type": "AllBlocksCleared"})
    await until(lambda: held(index) == 0)
    await stop(task)


async def test_other_hashing_makes_the_index_unusable(engine: FakePublisher) -> None:
    index, task = await joined(engine)
    event = stored(IDS, BS)
    event["block_hashes"] = [h ^ 1 for h in event["block_hashes"]]  # another seed or algorithm
    await engine.send(event)
    await until(lambda: not index.usable)
    assert index.hashes(IDS) is None and index.cached_tokens(HASHES, [URL]) == {}
    await stop(task)
