"""The in-flight limit: beyond `max_inflight` requests a replica answers 429 at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from boomerang.router.__main__ import cli_overrides, parse_args
from boomerang.router.admission import InflightLimit, Overloaded
from boomerang.router.app import INFLIGHT
from boomerang.router.config import RouterConfig

STATIC = {"prefill": {"urls": ["http://127.0.0.1:1"]}, "decode": {"urls": ["http://127.0.0.1:2"]}}


def chat(text: str) -> dict[str, Any]:
    return {"model": "fake", "messages": [{"role": "user", "content": text}]}


def engine_calls(w: Any) -> int:
    return sum(len(spec.calls) for spec in (*w.prefill, *w.decode))


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_max_inflight_comes_from_the_file_env_or_flag() -> None:
    assert RouterConfig.model_validate(STATIC).max_inflight == 1024
    env = {"BOOMERANG_ROUTER_MAX_INFLIGHT": "64", "BOOMERANG_ROUTER_OVERLOAD_RETRY_AFTER_S": "3"}
    loaded = RouterConfig.load(env=env, overrides=STATIC)
    assert (loaded.max_inflight, loaded.overload_retry_after_s) == (64, 3)
    flags = cli_overrides(parse_args(["--max-inflight", "0"]))
    assert RouterConfig.load(env=env, overrides={**STATIC, **flags}).max_inflight == 0
    with pytest.raises(ValidationError):
        RouterConfig.model_validate({**STATIC, "max_inflight": -1})


def test_zero_means_unlimited_and_a_slot_is_freed_on_error() -> None:
    unlimited = InflightLimit(0, 1)
    with unlimited.slot(), unlimited.slot(), unlimited.slot():
        assert unlimited.current == 3
    one = InflightLimit(1, 7)
    with pytest.raises(RuntimeError), one.slot():
        raise RuntimeError("the handler failed")
    assert one.current == 0
    with one.slot(), pytest.raises(Overloaded) as refused, one.slot():
        pass
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "7"}
    assert one.current == 0


async def test_one_request_past_the_limit_gets_429_and_reaches_no_engine(world: Any) -> None:
    w = await world(max_inflight=3, overload_retry_after_s=2, decode_spec={"delay_s": 1.0})
    limit = w.client.server.app[INFLIGHT]
    held = [
        asyncio.create_task(w.client.post("/v1/chat/completions", json=chat(f"slow {i}")))
        for i in range(3)
    ]
    await until(lambda: limit.current == 3 and len(w.decode[0].calls) == 3)
    calls_before = engine_calls(w)
    refused = await w.client.post("/v1/chat/completions", json=chat("one too many"))
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "2"
    assert refused.headers["X-Request-Id"]
    error = (await refused.json())["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    assert engine_calls(w) == calls_before
    assert await w.metric("boomerang_router_inflight_requests") == 3
    for path in ("/health", "/ready", "/metrics", "/v1/models"):  # never limited
        assert (await w.client.get(path)).status == 200, path
    statuses = [(await task).status for task in held]
    assert statuses == [200, 200, 200]
    assert await w.metric("boomerang_router_requests_total", outcome="overloaded") == 1
    assert await w.metric("boomerang_router_requests_total", outcome="ok") == 3
    assert await w.metric("boomerang_router_inflight_requests") == 0
    assert len(w.prefill[0].calls) == 3  # the refused request was never prefilled
    assert w.fabric.violations == []


async def test_a_client_that_goes_away_frees_its_slot(world: Any) -> None:
    w = await world(max_inflight=1, decode_spec={"delay_s": 1.0})
    limit = w.client.server.app[INFLIGHT]
    gone = asyncio.create_task(w.client.post("/v1/chat/completions", json=chat("slow")))
    await until(lambda: limit.current == 1)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    await until(lambda: limit.current == 0)
    resp = await w.client.post("/v1/chat/completions", json=chat("next"))
    assert resp.status == 200


async def test_requests_refused_for_their_key_take_no_slot(world: Any, tmp_path: Any) -> None:
    keys = tmp_path / "keys"
    keys.write_text("good\n")
    w = await world(max_inflight=1, api_keys_file=str(keys), decode_spec={"delay_s": 1.0})
    limit = w.client.server.app[INFLIGHT]
    good = {"Authorization": "Bearer good"}
    held = asyncio.create_task(w.client.post("/v1/chat/completions", json=chat("a"), headers=good))
    await until(lambda: limit.current == 1)
    bad = await w.client.post(
        "/v1/chat/completions", json=chat("b"), headers={"Authorization": "x"}
    )
    assert bad.status == 401  # authenticated first: a stranger learns nothing about load
    assert (await w.client.post("/v1/chat/completions", json=chat("c"), headers=good)).status == 429
    assert (await held).status == 200
