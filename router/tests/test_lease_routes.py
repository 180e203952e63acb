"""D's lease API through the router: the lease client against the fake decoder's lease API,
the conversation routes (end, renew) and `/boomerang/v1/state`, and adaptive retention
releasing D's blocks before its TTL, with the fake fabric checking that no released block is
ever read."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from router_testing import EngineSpec, Fabric, FakeEngine, Held, chat, filed, free_port, post

from boomerang.router.app import RETENTION, ROUTER
from boomerang.router.config import RouterConfig
from boomerang.router.retention.lease_client import LeaseClient, LeaseFailure

TOKEN = "s3cret"


def router_config(url: str, token_file: Path | None = None) -> RouterConfig:
    cfg: dict[str, Any] = {"prefill": {"urls": ["http://p"]}, "decode": {"urls": [url]}}
    if token_file is not None:
        cfg["lease_token_file"] = str(token_file)
    return RouterConfig.model_validate(cfg)


async def fake_decoder(**spec: Any) -> tuple[TestServer, EngineSpec]:
    d = EngineSpec(role="decode", engine_id="d0", fabric=Fabric(), **spec)
    server = TestServer(FakeEngine(d).app(), host="127.0.0.1")
    await server.start_server()
    return server, d


async def test_the_lease_client_releases_and_renews_with_the_token(tmp_path: Path) -> None:
    server, d = await fake_decoder(lease_token=TOKEN)
    url = str(server.make_url("")).rstrip("/")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    client = LeaseClient(router_config(url, token))
    d.fabric.held[("d0", "r1")] = Held([1, 2], expires_at=10.0)
    try:
        renewal = await client.renew(url, ["r1", "r2"], 30.0)
        assert renewal.unknown == ["r2"] and renewal.ceiling_s == 480.0
        assert renewal.renewed["r1"] == d.fabric.held[("d0", "r1")].expires_at > 10.0
        assert await client.release(url, ["r1", "r2"]) == (["r1"], ["r2"])
        assert ("d0", "r1") not in d.fabric.held
        token.write_text("rotated")  # a new token is read on the next call
        with pytest.raises(LeaseFailure) as refused:
            await client.release(url, ["r1"])
        assert refused.value.no_control and not refused.value.maybe_done
    finally:
        await client.close()
        await server.close()


@pytest.mark.parametrize(
    ("spec", "no_control", "maybe_done"),
    [
        ({"lease_token": None}, True, False),  # the engine has no token: 403
        ({"lease_token": TOKEN, "lease_api": False}, True, False),  # no plugin: 404
        ({"lease_token": TOKEN, "lease_status": 501}, True, False),  # unsupported vLLM
        ({"lease_token": TOKEN, "lease_status": 500}, False, True),  # failed after sending
    ],
    ids=["403", "404", "501", "500"],
)
async def test_what_each_lease_failure_means(
    spec: dict[str, Any], no_control: bool, maybe_done: bool
) -> None:
    server, _ = await fake_decoder(**spec)
    url = str(server.make_url("")).rstrip("/")
    client = LeaseClient(router_config(url), env={"BOOMERANG_LEASE_TOKEN": TOKEN})
    try:
        with pytest.raises(LeaseFailure) as failed:
            await client.release(url, ["r1"])
        assert (failed.value.no_control, failed.value.maybe_done) == (no_control, maybe_done)
    finally:
        await client.close()
        await server.close()


async def test_without_a_token_or_a_reachable_decoder_nothing_was_released() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = LeaseClient(router_config(url), env={})
    with pytest.raises(LeaseFailure) as no_token:
        await client.release(url, ["r1"])
    assert no_token.value.no_control and not no_token.value.maybe_done
    client = LeaseClient(router_config(url), env={"BOOMERANG_LEASE_TOKEN": TOKEN})
    with pytest.raises(LeaseFailure) as refused:
        await client.release(url, ["r1"])
    assert not refused.value.maybe_done
    await client.close()


# -- through the router ---------------------------------------------------------------------


async def leased_world(world: Any, tmp_path: Path, **config: Any) -> Any:
    token = tmp_path / "lease-token"
    token.write_text(TOKEN)
    spec = {"lease_token": TOKEN, **config.pop("decode_spec", {})}
    return await world(decode_spec=spec, lease_token_file=str(token), **config)


def d_request_id(w: Any) -> str:
    """The request id of D's one held (retained) request."""
    (rid,) = [rid for (engine, rid) in w.fabric.held if engine == "d0"]
    return rid


async def turn(w: Any, history: list[dict[str, Any]], cid: str = "c", **headers: str) -> Any:
    status, body = await post(w, chat(history, conversation_id=cid), **headers)
    assert status == 200, body
    return body["choices"][0]["message"]


@pytest.mark.parametrize("mode", ["static", "adaptive"])
async def test_ending_a_conversation_frees_d_s_blocks_at_once(
    world: Any, tmp_path: Path, mode: str
) -> None:
    w = await leased_world(world, tmp_path, tuning={"mode": mode})
    await turn(w, [{"role": "user", "content": "hello"}])
    await filed(w, 1)
    rid = d_request_id(w)
    r = await w.client.delete("/boomerang/v1/conversations/c")
    assert r.status == 204
    assert w.decode[0].released == [rid] and ("d0", rid) not in w.fabric.held
    assert await w.metric("boomerang_router_leases_released_total", reason="ended") == 1
    r = await w.client.delete("/boomerang/v1/conversations/c")
    assert r.status == 404
    assert (await r.json())["error"]["type"] == "not_found_error"


async def test_conversation_routes_are_scoped_to_the_caller_s_tenant(
    world: Any, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a alice\nkey-b bob\n")
    w = await leased_world(world, tmp_path, api_keys_file=str(keys))
    alice = {"Authorization": "Bearer key-a"}
    bob = {"Authorization": "Bearer key-b"}
    await turn(w, [{"role": "user", "content": "hello"}], **alice)
    await filed(w, 1)
    assert (await w.client.delete("/boomerang/v1/conversations/c")).status == 401
    assert (await w.client.delete("/boomerang/v1/conversations/c", headers=bob)).status == 404
    r = await w.client.post("/boomerang/v1/conversations/c/renew", headers=bob)
    assert r.status == 404
    assert w.decode[0].lease_calls == []
    assert (await w.client.delete("/boomerang/v1/conversations/c", headers=alice)).status == 204


async def test_a_renewed_conversation_still_reuses_d_s_blocks(world: Any, tmp_path: Path) -> None:
    w = await leased_world(
        world, tmp_path, decoder_blocks_ttl_s=60, decode_spec={"decoder_ttl_s": 60}
    )
    history = [{"role": "user", "content": "hello"}]
    history += [await turn(w, history)]
    await filed(w, 1)
    rid = d_request_id(w)
    before = w.fabric.held[("d0", rid)].expires_at
    r = await w.client.post("/boomerang/v1/conversations/c/renew")  # no body: to the ceiling
    assert r.status == 200, await r.text()
    # D's 60 s from now, less P's decline window and the margin: the handle TTL rule
    assert (await r.json())["expires_in_s"] == pytest.approx(60 - 5 - 6, abs=0.5)
    assert w.decode[0].renewed == [rid] and w.fabric.held[("d0", rid)].expires_at > before
    r = await w.client.post("/boomerang/v1/conversations/c/renew", json={"seconds": 20})
    assert r.status == 200  # shorter than what it has: a renewal never shortens
    assert (await r.json())["expires_in_s"] == pytest.approx(60 - 5 - 6, abs=0.5)
    assert await w.metric("boomerang_router_leases_renewed_total") == 2
    await turn(w, [*history, {"role": "user", "content": "next"}])
    assert await w.reuse("hit") == 1
    assert w.fabric.violations == []
    r = await w.client.post("/boomerang/v1/conversations/c/renew", json={"seconds": -1})
    assert r.status == 400


async def test_a_renewal_d_cannot_make_is_a_502_and_keeps_the_handle(
    world: Any, tmp_path: Path
) -> None:
    w = await leased_world(world, tmp_path, decode_spec={"lease_status": 500})
    history = [{"role": "user", "content": "hello"}]
    history += [await turn(w, history)]
    await filed(w, 1)
    r = await w.client.post("/boomerang/v1/conversations/c/renew", json={"seconds": 30})
    assert r.status == 502
    assert await w.metric("boomerang_router_lease_errors_total", op="renew") == 1
    await turn(w, [*history, {"role": "user", "content": "next"}])
    assert await w.reuse("hit") == 1


async def test_adaptive_retention_frees_d_s_blocks_after_the_learned_gap(
    world: Any, tmp_path: Path
) -> None:
    w = await leased_world(world, tmp_path, tuning={"mode": "adaptive", "retention_min_s": 0})
    retention = w.client.server.app[RETENTION]
    for _ in range(40):  # conversations here come back within half a second, or never
        retention.learner.observe(None, 0.3, time.time())
    history = [{"role": "user", "content": "hello"}]
    await turn(w, history)
    await filed(w, 1)
    rid = d_request_id(w)
    for _ in range(60):
        if w.decode[0].released:
            break
        await asyncio.sleep(0.1)
    assert w.decode[0].released == [rid] and ("d0", rid) not in w.fabric.held
    assert await w.metric("boomerang_router_leases_released_total", reason="expired") == 1
    state = await (await w.client.get("/boomerang/v1/state")).json()
    assert state["mode"] == "adaptive" and state["retained_blocks"] == 0
    assert {"retention_s", "retained_fraction", "leases"} <= state.keys()


async def test_state_needs_no_api_key_and_static_mode_releases_nothing(
    world: Any, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a alice\n")
    w = await leased_world(world, tmp_path, api_keys_file=str(keys))
    await turn(w, [{"role": "user", "content": "hello"}], Authorization="Bearer key-a")
    await filed(w, 1)
    await asyncio.sleep(1.3)  # a sweep interval: nothing happens in static mode
    state = await (await w.client.get("/boomerang/v1/state")).json()
    assert state["mode"] == "static" and state["leases"] == 0
    assert w.decode[0].lease_calls == []


def test_d_s_kv_cache_size_comes_from_its_cache_config_gauge() -> None:
    from boomerang.router.engines.health import kv_blocks_from_metrics

    def page(*values: str) -> bytes:
        lines = ["# TYPE vllm:cache_config_info gauge"]
        for i, v in enumerate(values):
            lines.append(f'vllm:cache_config_info{{block_size="16",engine="{i}",{v}}} 1.0')
        return ("\n".join(lines) + "\n").encode()

    assert kv_blocks_from_metrics(page('num_gpu_blocks="2048"')) == 2048
    assert kv_blocks_from_metrics(page('num_gpu_blocks="900"', 'num_gpu_blocks="700"')) == 700
    assert kv_blocks_from_metrics(page('num_gpu_blocks="None"')) == 0  # not allocated yet
    assert kv_blocks_from_metrics(page('cache_dtype="auto"')) == 0
    assert kv_blocks_from_metrics(b"not a metrics page {") == 0


async def test_the_prober_learns_d_s_kv_cache_size(world: Any) -> None:
    w = await world(decode_spec={"kv_blocks": 4096})
    router = w.client.server.app[ROUTER]
    (d,) = router.decode.endpoints.values()
    assert d.kv_blocks == 4096


async def test_over_d_s_memory_budget_the_router_releases_without_waiting(
    world: Any, tmp_path: Path
) -> None:
    w = await leased_world(
        world,
        tmp_path,
        decode_spec={"kv_blocks": 4},
        tuning={"mode": "adaptive", "decode_memory_budget": 0.5},
    )
    await turn(w, [{"role": "user", "content": "a long question " * 30}])
    await filed(w, 1)
    rid = d_request_id(w)
    for _ in range(40):
        if w.decode[0].released:
            break
        await asyncio.sleep(0.1)
    assert w.decode[0].released == [rid]
    assert await w.metric("boomerang_router_leases_released_total", reason="budget") == 1
