"""A role without an engine: the turn is served by one engine of the other role as a plain
request and relayed like a normal turn, with no handle attached to it or filed from it; a taken
handle goes back to the store. First the pure choice of path, then turns through fake engines."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from router_testing import chat, filed, post, stream

from boomerang.router import conversation as conv
from boomerang.router.app import ROUTER
from boomerang.router.auth import ANONYMOUS
from boomerang.router.config import RouterConfig, env_overrides
from boomerang.router.engines.endpoints import Pool, Role
from boomerang.router.turn.degraded import (
    Route,
    Supply,
    after_failure,
    no_engine_message,
    route,
    supply,
)

# -- the choice of path (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefill", "decode", "fallback", "path"),
    [
        ("healthy", "healthy", True, "pd"),
        ("none", "healthy", True, "decode"),
        ("ejected", "healthy", True, "decode"),
        ("healthy", "none", True, "prefill"),
        ("healthy", "ejected", True, "prefill"),
        ("ejected", "ejected", True, "pd"),  # ejected engines rather than none, as without it
        ("ejected", "none", True, "prefill"),
        ("none", "ejected", True, "decode"),
        ("none", "none", True, None),
        ("healthy", "healthy", False, "pd"),
        ("ejected", "healthy", False, "pd"),
        ("healthy", "ejected", False, "pd"),
        ("none", "healthy", False, None),
        ("healthy", "none", False, None),
        ("none", "none", False, None),
    ],
)
def test_the_path_of_a_turn_follows_what_each_role_offers(
    prefill: Supply, decode: Supply, fallback: bool, path: Route | None
) -> None:
    assert route(prefill, decode, fallback=fallback) == path


@pytest.mark.parametrize(
    ("failed", "other", "fallback", "alone"),
    [
        ("prefill", "healthy", True, "decode"),
        ("prefill", "ejected", True, "decode"),
        ("prefill", "none", True, None),
        ("decode", "healthy", True, "prefill"),
        ("decode", "ejected", True, "prefill"),
        ("decode", "none", True, None),
        ("prefill", "healthy", False, None),
        ("decode", "healthy", False, None),
    ],
)
def test_once_a_role_failed_everywhere_the_other_serves_alone(
    failed: Role, other: Supply, fallback: bool, alone: Role | None
) -> None:
    assert after_failure(failed, other, fallback=fallback) == alone


def test_a_pool_offers_healthy_engines_only_ejected_ones_or_none() -> None:
    pool = Pool("prefill")
    assert supply(pool) == "none"
    pool.set_urls(["http://a", "http://b"])
    assert supply(pool) == "healthy"
    pool.endpoints["http://a"].ejected = True
    assert supply(pool) == "healthy"
    pool.endpoints["http://b"].ejected = True
    assert supply(pool) == "ejected"


def test_the_503_names_the_roles_without_an_engine() -> None:
    assert no_engine_message("none", "healthy") == "no prefill engine is available"
    assert no_engine_message("ejected", "none") == "no decode engine is available"
    assert no_engine_message("none", "none") == "no prefill or decode engine is available"


def test_the_switch_is_on_by_default_and_the_environment_turns_it_off() -> None:
    static = {"prefill": {"urls": ["http://p:1"]}, "decode": {"urls": ["http://d:1"]}}
    assert RouterConfig.model_validate(static).single_engine_fallback is True
    env = env_overrides({"BOOMERANG_ROUTER_SINGLE_ENGINE_FALLBACK": "false"})
    assert RouterConfig.model_validate({**static, **env}).single_engine_fallback is False


# -- turns through fake engines ---------------------------------------------------------------


def pool(w: Any, role: str) -> Pool:
    router = w.client.server.app[ROUTER]
    return router.prefill if role == "prefill" else router.decode


def engine_url(w: Any, role: str) -> str:
    """The base URL of the role's first engine (servers: every P, then every D)."""
    server = w.servers[0 if role == "prefill" else len(w.prefill)]
    return str(server.make_url("")).rstrip("/")


async def direct(w: Any, role: str, body: dict[str, Any], path: str) -> Any:
    """What the engine itself answers `body`, as a client of the router would see it: the
    response (or its stream's chunks), without the per-request `id` and the engine's null
    kv_transfer_params (the router never passes them on)."""
    resp = await w.client.session.post(engine_url(w, role) + path, json=body)
    assert resp.status == 200
    if not body.get("stream"):
        return comparable(await resp.json())
    raw = (await resp.read()).decode()
    events = [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [comparable(json.loads(e)) for e in events[:-1]]


def comparable(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k not in ("id", "kv_transfer_params")}


async def routed(w: Any, body: dict[str, Any], path: str) -> Any:
    """The router's answer to `body`, comparable with `direct`."""
    if body.get("stream"):
        return [comparable(c) for c in await stream(w, body, path)]
    resp = await w.client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    return comparable(await resp.json())


async def degraded(w: Any, missing: str) -> float:
    return await w.metric("boomerang_router_degraded_turns_total", missing=missing)


async def settled(w: Any, outcome: str, n: int = 1) -> None:
    """Wait until n turns counted `outcome`: the router counts a turn after answering it, once
    a taken handle went back to the store."""
    for _ in range(200):
        if await w.reuse(outcome) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} turns never counted {outcome}")


CASES = [
    ("/v1/chat/completions", chat([{"role": "user", "content": "hello there"}])),
    ("/v1/completions", {"model": "fake", "prompt": "once upon a time", "max_tokens": 6}),
]


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(("path", "body"), CASES)
async def test_without_a_prefill_engine_decode_alone_serves_the_turn(
    world: Any, caplog: Any, path: str, body: dict[str, Any], streamed: bool
) -> None:
    caplog.set_level(logging.INFO, logger="boomerang.router")
    w = await world()
    pool(w, "prefill").set_urls([])  # the only P pod restarts: discovery lists none
    body = {**body, "stream": streamed}
    got = await routed(w, body, path)
    d_call = w.decode[0].calls[-1]
    assert "kv_transfer_params" not in d_call
    assert d_call["return_token_ids"] is True  # a stream that dies can be carried over
    assert got == await direct(w, "decode", body, path)  # relayed as the engine answered
    assert w.prefill[0].calls == []
    assert await degraded(w, "prefill") == 1 and await degraded(w, "decode") == 0
    assert await w.metric("boomerang_router_requests_total", outcome="ok") == 1
    await settled(w, "miss")
    assert await w.metric("boomerang_router_handles_stored_total") == 0
    assert pool(w, "decode").endpoints[engine_url(w, "decode")].stream_params is None
    (warning,) = [r for r in caplog.records if r.getMessage() == "Serving turn on one engine"]
    assert warning.levelno == logging.WARNING
    assert (warning.role, warning.reason) == ("decode", "no prefill engine is listed")  # type: ignore[attr-defined]
    (line,) = [r for r in caplog.records if r.getMessage() == "Served turn"]
    assert line.alone == "decode"  # type: ignore[attr-defined]
    assert w.decode[0].request_ids[0].endswith("-s1")  # type: ignore[union-attr]
    assert w.fabric.violations == []


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(("path", "body"), CASES)
async def test_without_a_decode_engine_prefill_alone_serves_the_turn(
    world: Any, path: str, body: dict[str, Any], streamed: bool
) -> None:
    w = await world()
    pool(w, "decode").set_urls([])
    body = {**body, "stream": streamed}
    got = await routed(w, body, path)
    (p_call,) = w.prefill[0].calls
    assert "kv_transfer_params" not in p_call
    assert p_call["return_token_ids"] is True  # a stream that dies can be carried over
    assert p_call.get("max_tokens") == body.get("max_tokens")  # the whole answer, not 1 token
    assert got == await direct(w, "prefill", body, path)
    assert w.decode[0].calls == []
    assert await degraded(w, "decode") == 1 and await degraded(w, "prefill") == 0
    await settled(w, "miss")
    assert await w.metric("boomerang_router_handles_stored_total") == 0
    assert w.fabric.violations == []


async def test_a_prefill_engine_that_only_failed_probes_is_skipped(world: Any) -> None:
    w = await world()
    w.prefill[0].healthy = False  # its probes fail until the prober ejects it
    for _ in range(100):
        if pool(w, "prefill").endpoints[engine_url(w, "prefill")].ejected:
            break
        await asyncio.sleep(0.05)
    status, _ = await post(w, chat([{"role": "user", "content": "x"}]))
    assert status == 200
    assert w.prefill[0].calls == []
    assert await degraded(w, "prefill") == 1


async def test_every_prefill_engine_failing_falls_back_to_decode_alone(world: Any) -> None:
    w = await world(n_prefill=2)
    w.prefill[0].fail_status = w.prefill[1].fail_status = 500
    body = chat([{"role": "user", "content": "x"}])
    status, got = await post(w, body)
    assert status == 200
    assert [len(s.calls) for s in w.prefill] == [1, 1]
    assert "kv_transfer_params" not in w.decode[0].calls[-1]
    assert comparable(got) == await direct(w, "decode", body, "/v1/chat/completions")
    assert await degraded(w, "prefill") == 1
    assert w.fabric.violations == []


async def test_every_decode_engine_failing_falls_back_to_prefill_alone(world: Any) -> None:
    w = await world()
    w.decode[0].fail_status = 500
    body = chat([{"role": "user", "content": "x"}])
    status, got = await post(w, body)
    assert status == 200
    assert "kv_transfer_params" not in w.prefill[0].calls[-1]  # after the turn's prefills
    assert comparable(got) == await direct(w, "prefill", body, "/v1/chat/completions")
    assert await degraded(w, "decode") == 1
    assert w.fabric.violations == []


async def test_a_handle_held_through_a_degraded_turn_is_back_for_the_next(world: Any) -> None:
    w = await world()
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    await filed(w, 1)
    p_urls = list(pool(w, "prefill").endpoints)
    pool(w, "prefill").set_urls([])
    history += [first["choices"][0]["message"], {"role": "user", "content": "q"}]
    status, second = await post(w, chat(history, conversation_id="c"))
    assert status == 200
    await settled(w, "fallback")  # the handle was found, not used, and went back
    assert await w.metric("boomerang_router_handles_stored_total") == 1  # nothing filed
    pool(w, "prefill").set_urls(p_urls)  # P is back: D still holds the first turn's blocks
    history += [second["choices"][0]["message"], {"role": "user", "content": "z"}]
    status, _ = await post(w, chat(history, conversation_id="c"))
    assert status == 200
    assert await w.reuse("hit") == 1
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"]
    assert w.fabric.violations == []


async def test_an_attached_handle_no_prefill_received_goes_back_to_the_store(
    world: Any, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING, logger="boomerang.router")
    w = await world()
    prompt = [5, 6, 7, 8]  # token ids: verified without tokenize, so P's refusal comes later
    r1 = await w.client.post(
        "/v1/completions", json={"prompt": prompt, "conversation_id": "t", "return_token_ids": True}
    )
    nxt = prompt + (await r1.json())["choices"][0]["token_ids"] + [9, 10]
    await filed(w, 1)
    await w.servers[0].close()  # P refuses connections: it never saw the handle
    r2 = await w.client.post("/v1/completions", json={"prompt": nxt, "conversation_id": "t"})
    assert r2.status == 200
    await settled(w, "fallback")
    assert await w.reuse("hit") == 0
    (warning,) = [r for r in caplog.records if r.getMessage() == "Serving turn on one engine"]
    assert warning.reason == "no prefill engine could serve the request: connect"  # type: ignore[attr-defined]
    assert "kv_transfer_params" not in w.decode[0].calls[-1]
    store = w.client.server.app[ROUTER].store
    found, handle = await store.take(conv.id_key(ANONYMOUS, "t"), time.time())
    assert found == "found" and handle is not None
    assert w.fabric.violations == []


async def test_no_engine_of_either_role_is_a_503(world: Any) -> None:
    w = await world()
    pool(w, "prefill").set_urls([])
    pool(w, "decode").set_urls([])
    status, body = await post(w, chat([{"role": "user", "content": "x"}]))
    assert status == 503
    assert body["error"]["type"] == "service_unavailable"
    assert body["error"]["message"] == "no prefill or decode engine is available"
    assert await degraded(w, "prefill") == await degraded(w, "decode") == 0


@pytest.mark.parametrize("role", ["prefill", "decode"])
async def test_with_the_switch_off_a_missing_role_is_a_503(world: Any, role: str) -> None:
    w = await world(single_engine_fallback=False)
    pool(w, role).set_urls([])
    status, body = await post(w, chat([{"role": "user", "content": "x"}]))
    assert status == 503
    assert body["error"] == {
        "message": f"no {role} engine is available",
        "type": "service_unavailable",
        "param": None,
        "code": 503,
    }
    assert w.prefill[0].calls == w.decode[0].calls == []
    assert await degraded(w, role) == 0
