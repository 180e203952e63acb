"""The Redis store against a real redis-server that the test starts on a free loopback port."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from router_testing import free_port, wait_port

from boomerang.router.conversation import Handle
from boomerang.router.redis_store import RedisStore

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: Any) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing (run `make redis`)")
        pytest.skip("redis-server is not installed (run `make redis`)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not wait_port(port, 10.0):
            pytest.fail("redis-server did not start")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStore]:
    s = RedisStore(redis_url, f"test:{time.monotonic_ns()}:")
    yield s
    await s.close()


def handle(expires_in: float = 60.0, tag: str = "a") -> Handle:
    return Handle(
        b'{"x":"' + tag.encode() + b'"}', b"\x01" * 16, 7, "http://d", time.time() + expires_in
    )


async def test_put_then_take_returns_the_handle_once(store: RedisStore) -> None:
    await store.put(b"k", handle())
    status, got = await store.take(b"k", time.time())
    assert status == "found"
    assert got is not None and got.params == b'{"x":"a"}' and got.num_tokens == 7
    assert (await store.take(b"k", time.time()))[0] == "missing"


async def test_block_hashes_round_trip_and_earlier_handles_still_take(store: RedisStore) -> None:
    full = Handle(b"p", b"\x01" * 16, 8, "http://d", time.time() + 60, 4, b"\x02" * 16)
    await store.put(b"k", full)
    assert await store.take(b"k", time.time()) == ("found", full)
    earlier = json.loads(full.encode())[:5]  # what a router without block hashes wrote
    await store._redis.set(store._name(b"old"), json.dumps(earlier), px=60_000)
    status, got = await store.take(b"old", time.time())
    assert status == "found" and got is not None
    assert (got.block_size, got.block_hashes, got.params) == (0, b"", b"p")
    await store._redis.set(store._name(b"bad"), b'["x", "zz", 1]', px=60_000)
    assert await store.take(b"bad", time.time()) == ("missing", None)


async def test_put_says_which_handle_it_replaced(store: RedisStore) -> None:
    assert await store.put(b"k", handle(tag="old")) is None
    replaced = await store.put(b"k", handle(tag="new"))
    assert replaced is not None and replaced.params == b'{"x":"old"}'
    await store._redis.set(store._name(b"bad"), b"garbage", px=60_000)
    assert await store.put(b"bad", handle()) is None  # unreadable: nothing provably replaced


async def test_concurrent_takes_give_the_handle_to_exactly_one(redis_url: str) -> None:
    stores = [RedisStore(redis_url, "race:") for _ in range(8)]
    await stores[0].put(b"k", handle())
    results = await asyncio.gather(*(s.take(b"k", time.time()) for s in stores))
    assert sorted(status for status, _ in results).count("found") == 1
    for s in stores:
        await s.close()


async def test_expired_handle_is_reported_as_expired(store: RedisStore) -> None:
    await store.put(b"k", handle(expires_in=-1.0))
    assert (await store.take(b"k", time.time())) == ("expired", None)


async def test_redis_drops_keys_after_the_grace_period(store: RedisStore) -> None:
    h = handle(expires_in=-299.8)  # grace is 300 s: the key lives ~0.2 s
    await store.put(b"k", h)
    await asyncio.sleep(0.5)
    assert (await store.take(b"k", time.time()))[0] == "missing"


async def test_restore_never_overwrites_a_newer_handle(store: RedisStore) -> None:
    await store.put(b"k", handle(tag="new"))
    await store.restore(b"k", handle(tag="old"), time.time())
    _, got = await store.take(b"k", time.time())
    assert got is not None and got.params == b'{"x":"new"}'
    await store.restore(b"k", handle(tag="old"), time.time())
    _, got = await store.take(b"k", time.time())
    assert got is not None and got.params == b'{"x":"old"}'


async def test_router_replicas_share_conversations_through_redis(
    world: Any, redis_url: str
) -> None:
    store_cfg = {"kind": "redis", "url": redis_url, "key_prefix": f"w:{time.monotonic_ns()}:"}
    w = await world(store=store_cfg)
    history = [{"role": "user", "content": "hello"}]
    r = await w.client.post(
        "/v1/chat/completions", json={"messages": history, "conversation_id": "c"}
    )
    first = await r.json()
    history += [first["choices"][0]["message"], {"role": "user", "content": "next"}]
    r = await w.client.post(
        "/v1/chat/completions", json={"messages": history, "conversation_id": "c"}
    )
    assert r.status == 200
    assert await w.reuse("hit") == 1
    assert w.fabric.violations == []


async def test_a_partial_reuse_works_through_redis(world: Any, redis_url: str) -> None:
    store_cfg = {"kind": "redis", "url": redis_url, "key_prefix": f"p:{time.monotonic_ns()}:"}
    # No affinity: P's own cache would hold the reusable blocks, and the partial not be pulled.
    w = await world(store=store_cfg, decode_spec={"reasoning": True}, affinity=False)
    history = [{"role": "user", "content": "a question long enough for a few blocks " * 4}]
    body = {"messages": history, "conversation_id": "c"}
    first = await (await w.client.post("/v1/chat/completions", json=body)).json()
    for _ in range(200):  # the handle is filed just after the answer
        if await w.metric("boomerang_router_handles_stored_total") == 1:
            break
        await asyncio.sleep(0.01)
    history += [first["choices"][0]["message"], {"role": "user", "content": "next"}]
    r = await w.client.post("/v1/chat/completions", json={**body, "messages": history})
    assert r.status == 200
    assert await w.reuse("partial") == 1
    assert w.fabric.violations == []
