"""The P/D flow through the router against fake engines that keep vLLM's protocol."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fake_tokenizer import render_chat
from router_testing import chat, filed, free_port, post, stream

from boomerang.router import conversation as conv
from boomerang.router.app import ROUTER
from boomerang.router.auth import ANONYMOUS


async def two_turns(w: Any, **extra: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    history = [{"role": "user", "content": "hello there"}]
    status, first = await post(w, chat(history, **extra))
    assert status == 200, first
    history += [first["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    status, second = await post(w, chat(history, **extra))
    assert status == 200, second
    return first, second


async def test_second_turn_pulls_history_back_from_decode(world: Any) -> None:
    w = await world()
    await two_turns(w, conversation_id="c1")
    assert await w.reuse("hit") == 1
    assert await w.reuse("miss") == 1
    assert [who for who, _ in w.fabric.pulls] == ["decode", "prefill", "decode"]
    assert w.fabric.violations == []


async def test_prefill_gets_one_token_then_decode_gets_prefill_params(world: Any) -> None:
    w = await world()
    await post(w, chat([{"role": "user", "content": "hi"}], max_completion_tokens=50))
    p_body, d_body = w.prefill[0].calls[0], w.decode[0].calls[0]
    assert p_body["max_tokens"] == 1 and p_body["stream"] is False
    assert "max_completion_tokens" not in p_body
    assert p_body["kv_transfer_params"]["do_remote_decode"] is True
    assert d_body["kv_transfer_params"]["do_remote_prefill"] is True
    assert d_body["max_completion_tokens"] == 50


async def test_unmodified_openai_clients_get_reuse_by_fingerprint(world: Any) -> None:
    w = await world()
    await two_turns(w)
    assert await w.reuse("hit") == 1


async def test_client_never_sees_engine_params_or_added_token_ids(world: Any) -> None:
    w = await world()
    first, second = await two_turns(w, conversation_id="c1")
    for body in (first, second):
        assert "kv_transfer_params" not in body
        assert "prompt_token_ids" not in body
        assert "token_ids" not in body["choices"][0]
        assert body["usage"]["completion_tokens"] > 0


async def test_client_that_asked_for_token_ids_keeps_them(world: Any) -> None:
    w = await world()
    _, body = await post(w, chat([{"role": "user", "content": "x"}], return_token_ids=True))
    assert body["prompt_token_ids"] == render_chat([{"role": "user", "content": "x"}])
    assert body["choices"][0]["token_ids"]


async def test_client_supplied_kv_transfer_params_are_never_forwarded(world: Any) -> None:
    w = await world()
    forged = {
        "do_remote_decode": True,
        "remote_block_ids": [[1]],
        "remote_engine_id": "d0",
        "remote_request_id": "someone-else",
        "remote_host": "1.2.3.4",
        "remote_port": 1,
        "remote_num_tokens": 3,
    }
    status, _ = await post(w, chat([{"role": "user", "content": "x"}], kv_transfer_params=forged))
    assert status == 200
    assert w.prefill[0].calls[0]["kv_transfer_params"]["remote_block_ids"] is None
    assert w.fabric.violations == []


async def test_edited_history_is_rejected_and_recomputed(world: Any) -> None:
    w = await world()
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    reply = dict(first["choices"][0]["message"], content="an edited reply")
    _, _ = await post(
        w, chat([*history, reply, {"role": "user", "content": "q"}], conversation_id="c")
    )
    assert await w.reuse("rejected") == 1
    assert await w.reuse("hit") == 0
    assert w.fabric.violations == []
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"] is None


async def test_stripped_reasoning_never_attaches_a_handle(world: Any) -> None:
    w = await world(decode_spec={"reasoning": True})
    await two_turns(w, conversation_id="r")
    assert await w.reuse("rejected") == 1
    assert w.fabric.violations == []


async def test_one_tenant_cannot_reach_another_tenants_conversation(
    world: Any, tmp_path: Any
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    w = await world(api_keys_file=str(keys))
    history = [{"role": "user", "content": "secret"}]
    a = {"Authorization": "Bearer key-a"}
    status, first = await post(w, chat(history, conversation_id="same"), **a)
    assert status == 200
    history += [first["choices"][0]["message"], {"role": "user", "content": "more"}]
    status, _ = await post(w, chat(history, conversation_id="same"), Authorization="Bearer key-b")
    assert status == 200
    assert await w.reuse("hit") == 0
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"] is None


async def test_missing_or_wrong_api_key_is_401(world: Any, tmp_path: Any) -> None:
    keys = tmp_path / "keys"
    keys.write_text("good\n")
    w = await world(api_keys_file=str(keys))
    assert (await post(w, chat([{"role": "user", "content": "x"}])))[0] == 401
    status, body = await post(
        w, chat([{"role": "user", "content": "x"}]), Authorization="Bearer bad"
    )
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert (await w.client.get("/health")).status == 200


async def test_a_handle_is_used_once(world: Any) -> None:
    w = await world()
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    nxt = [*history, first["choices"][0]["message"], {"role": "user", "content": "q"}]
    await post(w, chat(nxt, conversation_id="c"))
    await post(w, chat(nxt, conversation_id="c"))  # a retry of the same turn by the client
    assert await w.reuse("hit") == 1
    assert w.fabric.violations == []


async def test_concurrent_turns_never_share_a_handle(world: Any) -> None:
    w = await world(prefill_spec={"delay_s": 0.05})
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    nxt = [*history, first["choices"][0]["message"], {"role": "user", "content": "q"}]
    results = await asyncio.gather(*(post(w, chat(nxt, conversation_id="c")) for _ in range(5)))
    assert all(status == 200 for status, _ in results)
    assert await w.reuse("hit") == 1
    assert w.fabric.violations == []


async def test_expired_handle_is_not_offered(world: Any) -> None:
    w = await world(decoder_blocks_ttl_s=10.2, handle_ttl_s=0.1)
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    await asyncio.sleep(0.2)
    nxt = [*history, first["choices"][0]["message"], {"role": "user", "content": "q"}]
    assert (await post(w, chat(nxt, conversation_id="c")))[0] == 200
    assert await w.reuse("expired") == 1
    assert w.fabric.violations == []


async def test_streaming_client_gets_reuse_from_an_engine_without_stream_params(world: Any) -> None:
    w = await world(decode_spec={"stream_params": False, "version": "0.32.0"})
    history = [{"role": "user", "content": "hello"}]
    events = await stream(w, chat(history, conversation_id="s"))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in events if c["choices"])
    assert text
    for chunk in events:
        assert "kv_transfer_params" not in chunk
    nxt = [*history, {"role": "assistant", "content": text}, {"role": "user", "content": "q"}]
    events = await stream(w, chat(nxt, conversation_id="s"))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in events if c["choices"])
    nxt2 = [*nxt, {"role": "assistant", "content": text}, {"role": "user", "content": "z"}]
    await stream(w, chat(nxt2, conversation_id="s"))
    # The first stream probed the engine (no params seen); later turns were buffered.
    assert w.decode[0].calls[0]["stream"] is True
    assert w.decode[0].calls[1]["stream"] is False
    assert await w.reuse("hit") == 1
    assert w.fabric.violations == []


async def test_streaming_passes_through_when_engine_streams_params(world: Any) -> None:
    w = await world(
        prefill_spec={"version": "0.33.0"}, decode_spec={"stream_params": True, "version": "0.33.0"}
    )
    history = [{"role": "user", "content": "hello"}]
    events = await stream(
        w, chat(history, conversation_id="s", stream_options={"include_usage": True})
    )
    assert events[-1]["usage"]["completion_tokens"] > 0
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in events if c["choices"])
    nxt = [*history, {"role": "assistant", "content": text}, {"role": "user", "content": "q"}]
    await stream(w, chat(nxt, conversation_id="s"))
    assert all(call["stream"] for call in w.decode[0].calls)
    assert await w.reuse("hit") == 1
    assert all("kv_transfer_params" not in e and "token_ids" not in str(e) for e in events)


async def test_completions_with_token_id_prompts_reuse_without_tokenize(world: Any) -> None:
    w = await world()
    prompt = [5, 6, 7, 8]
    r1 = await w.client.post(
        "/v1/completions", json={"prompt": prompt, "conversation_id": "t", "return_token_ids": True}
    )
    body = await r1.json()
    nxt = prompt + body["choices"][0]["token_ids"] + [9, 10]
    r2 = await w.client.post("/v1/completions", json={"prompt": nxt, "conversation_id": "t"})
    assert r2.status == 200
    assert await w.reuse("hit") == 1
    assert w.prefill[0].tokenize_calls == 0


async def test_prefill_failure_is_retried_on_another_prefill_without_the_handle(world: Any) -> None:
    w = await world(n_prefill=2)
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    assert len(w.prefill[0].calls) == 1  # ties rotate: the next turn goes to prefill 1 first
    w.prefill[1].fail_status = 500  # (the history is shorter than a block: nothing cached)
    nxt = [*history, first["choices"][0]["message"], {"role": "user", "content": "q"}]
    status, _ = await post(w, chat(nxt, conversation_id="c"))
    assert status == 200
    assert w.prefill[1].calls[-1]["kv_transfer_params"]["remote_block_ids"]  # got the handle
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"] is None  # recompute
    assert await w.reuse("fallback") == 1
    assert w.fabric.violations == []


async def test_refused_prefill_connection_keeps_the_handle_for_the_retry(world: Any) -> None:
    w = await world(n_prefill=2)
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    await w.servers[1].close()  # prefill 1: connection refused from now on
    nxt = [*history, first["choices"][0]["message"], {"role": "user", "content": "q"}]
    status, _ = await post(w, chat(nxt, conversation_id="c"))
    assert status == 200
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"]
    assert w.fabric.violations == []


async def test_a_dead_prefill_engine_never_loses_the_request(world: Any) -> None:
    w = await world(n_prefill=2)
    w.prefill[0].fail_status = 503
    for _ in range(4):
        status, _ = await post(w, chat([{"role": "user", "content": "x"}]))
        assert status == 200
    assert w.fabric.violations == []


async def test_a_dead_decode_engine_before_first_byte_is_retried_elsewhere(world: Any) -> None:
    w = await world(n_decode=2)
    w.decode[0].fail_status = 500
    for i in range(4):
        status, _ = await post(w, chat([{"role": "user", "content": f"x{i}"}]))
        assert status == 200
    assert w.fabric.violations == []
    assert await w.metric("boomerang_router_retries_total", role="decode") >= 1


async def test_engine_4xx_is_passed_to_the_client_not_retried(world: Any) -> None:
    w = await world(n_prefill=2)
    w.prefill[0].fail_status = w.prefill[1].fail_status = 400
    status, body = await post(w, chat([{"role": "user", "content": "x"}]))
    assert status == 400 and "engine failure" in body["error"]["message"]
    assert sum(len(s.calls) for s in w.prefill) == 1


async def test_no_engine_left_is_a_clear_5xx(world: Any) -> None:
    w = await world(single_engine_fallback=False)  # on, decode alone would serve it
    w.prefill[0].fail_status = 500
    status, body = await post(w, chat([{"role": "user", "content": "x"}]))
    assert status == 502 and "prefill" in body["error"]["message"]


async def test_no_engine_of_either_role_left_is_a_clear_5xx(world: Any) -> None:
    w = await world()
    w.prefill[0].fail_status = w.decode[0].fail_status = 500
    status, body = await post(w, chat([{"role": "user", "content": "x"}]))
    assert status == 502 and "decode" in body["error"]["message"]  # tried last, alone


async def test_decode_affinity_keeps_a_conversation_on_its_decoder(world: Any) -> None:
    w = await world(n_decode=3)
    history = [{"role": "user", "content": "hello"}]
    for i in range(4):
        _, body = await post(w, chat(history, conversation_id="aff"))
        history = [*history, body["choices"][0]["message"], {"role": "user", "content": f"{i}"}]
    used = [i for i, spec in enumerate(w.decode) if spec.calls]
    assert len(used) == 1
    assert await w.reuse("hit") == 3


async def test_ready_health_and_metrics_endpoints(world: Any) -> None:
    w = await world()
    assert (await w.client.get("/health")).status == 200
    ready = await w.client.get("/ready")
    assert ready.status == 200 and (await ready.json())["prefill"] == 1
    await two_turns(w, conversation_id="m")
    text = await (await w.client.get("/metrics")).text()
    for name in (
        "boomerang_router_requests_total",
        "boomerang_router_ttft_seconds_bucket",
        "boomerang_router_prefill_seconds",
        "boomerang_router_handles_stored_total",
    ):
        assert name in text
    assert await w.metric("boomerang_router_requests_total", outcome="ok") == 2
    models = await w.client.get("/v1/models")
    assert (await models.json())["data"][0]["id"] == "fake"


async def test_not_ready_without_a_live_decoder_when_p_alone_may_not_serve(world: Any) -> None:
    w = await world(single_engine_fallback=False)
    await w.servers[1].close()
    for _ in range(50):
        if (await w.client.get("/ready")).status == 503:
            break
        await asyncio.sleep(0.1)
    assert (await w.client.get("/ready")).status == 503


async def test_still_ready_without_a_decoder_while_p_alone_serves(world: Any) -> None:
    w = await world()
    await w.servers[1].close()
    for _ in range(50):
        if (await (await w.client.get("/ready")).json())["decode"] == 0:
            break
        await asyncio.sleep(0.1)
    ready = await w.client.get("/ready")
    assert ready.status == 200
    assert await ready.json() == {"ready": True, "prefill": 1, "decode": 0, "alone": True}


async def test_responses_carry_a_request_id(world: Any) -> None:
    w = await world()
    resp = await w.client.post(
        "/v1/chat/completions",
        json=chat([{"role": "user", "content": "x"}]),
        headers={"X-Request-Id": "abc-123"},
    )
    assert resp.headers["X-Request-Id"] == "abc-123"


async def test_engines_get_the_request_id_fresh_for_every_call(world: Any) -> None:
    """vLLM takes `X-Request-Id` as its request id: engine logs name the router's request.
    A client reusing its id, and retries, still never give an engine one id twice."""
    w = await world()
    history = [{"role": "user", "content": "hello there"}]
    seen: list[str] = []
    for _ in range(2):
        resp = await w.client.post(
            "/v1/chat/completions", json=chat(history, conversation_id="c"),
            headers={"X-Request-Id": "client-id"},
        )  # fmt: skip
        assert resp.status == 200
        first = (await resp.json())["choices"][0]["message"]
        history += [first, {"role": "user", "content": "more"}]
    for engine in (*w.prefill, *w.decode):
        seen += [rid for rid in engine.request_ids if rid is not None]
    calls = sum(len(e.request_ids) for e in (*w.prefill, *w.decode))
    assert len(seen) == calls, "an engine call went out without a request id"
    assert all(rid.startswith("client-id-") for rid in seen), seen
    assert len(set(seen)) == len(seen), f"an id was sent twice: {seen}"
    stages = sorted(rid.rsplit("-", 1)[1][0] for rid in seen)
    assert stages == ["d", "d", "p", "p", "t"], seen  # turn 2 tokenizes to verify the handle


async def test_client_disconnect_mid_stream_stops_the_decoder(world: Any) -> None:
    w = await world(decode_spec={"stream_params": True, "chunk_delay_s": 0.2, "reply_words": 12})
    body = chat([{"role": "user", "content": "long story"}], stream=True)
    resp = await w.client.post("/v1/chat/completions", json=body)
    assert resp.status == 200
    await resp.content.readany()
    resp.close()
    for _ in range(50):
        if w.decode[0].disconnected:
            break
        await asyncio.sleep(0.1)
    assert w.decode[0].disconnected == 1
    assert await w.metric("boomerang_router_requests_total", outcome="cancelled") == 1


async def test_a_store_outage_never_fails_a_request(world: Any) -> None:
    dead_port = free_port()
    w = await world(store={"kind": "redis", "url": f"redis://127.0.0.1:{dead_port}/0"})
    await two_turns(w, conversation_id="c")
    assert await w.metric("boomerang_router_store_errors_total", op="take") >= 1
    assert await w.metric("boomerang_router_store_errors_total", op="put") >= 1
    assert await w.metric("boomerang_router_requests_total", outcome="ok") == 2


async def test_a_decoder_silent_past_the_first_byte_timeout_is_replaced(world: Any) -> None:
    w = await world(
        n_decode=2,
        decode_spec={"stream_params": True},
        timeouts={"decode_first_byte_s": 1.5},
    )
    w.decode[0].delay_s = 4.0
    for i in range(2):
        events = await stream(w, chat([{"role": "user", "content": f"x{i}"}]))
        assert events
    assert (
        await w.metric("boomerang_router_upstream_failures_total", role="decode", kind="timeout")
        >= 1
    )
    assert w.fabric.violations == []


async def test_engines_behind_an_api_key_get_the_routers_key(world: Any) -> None:
    spec = {"api_key": "engine-secret"}
    w = await world(prefill_spec=spec, decode_spec=spec, engine_api_key="engine-secret")
    await two_turns(w, conversation_id="k")
    assert await w.reuse("hit") == 1


async def test_a_trusted_gateway_header_scopes_conversations(world: Any) -> None:
    w = await world(tenant_header="X-Tenant")
    history = [{"role": "user", "content": "hello"}]
    body = chat(history, conversation_id="c")
    _, first = await post(w, body, **{"X-Tenant": "a"})
    nxt = chat(
        [*history, first["choices"][0]["message"], {"role": "user", "content": "q"}],
        conversation_id="c",
    )
    await post(w, nxt, **{"X-Tenant": "b"})
    assert await w.reuse("hit") == 0
    await post(w, nxt, **{"X-Tenant": "a"})
    assert await w.reuse("hit") == 1


async def next_turn_recomputes(w: Any, history: list[Any], first: dict[str, Any]) -> None:
    """The conversation's next turn succeeds without its (void) handle: a fallback, no hit,
    and no read of blocks D no longer holds."""
    nxt = [*history, first["choices"][0]["message"], {"role": "user", "content": "q"}]
    status, _ = await post(w, chat(nxt, conversation_id="c"))
    assert status == 200
    assert await w.reuse("fallback") == 1
    assert await w.reuse("hit") == 0
    assert w.fabric.violations == []


async def test_a_decoder_that_went_down_after_the_turn_voids_its_handles(world: Any) -> None:
    w = await world()
    d = w.decode[0]
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    # D restarts between turns: it is down for a while and comes back without its blocks.
    d.healthy = False
    w.fabric.held.clear()
    for _ in range(100):
        if (await (await w.client.get("/ready")).json())["decode"] == 0:
            break
        await asyncio.sleep(0.05)
    d.healthy = True
    for _ in range(100):
        if (await (await w.client.get("/ready")).json())["decode"] == 1:
            break
        await asyncio.sleep(0.05)
    await next_turn_recomputes(w, history, first)


async def test_a_decoder_that_left_discovery_and_came_back_voids_its_handles(world: Any) -> None:
    """In Kubernetes a restarting D pod leaves the ready EndpointSlice and comes back at the
    same IP without its blocks; the router drops the endpoint meanwhile, so the comeback is a
    new endpoint, and it must still void the handles made before it left."""
    w = await world()
    pool = w.client.server.app[ROUTER].decode
    (d_url,) = pool.endpoints
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    for _ in range(100):  # the handle is filed just after the answer is sent
        if await w.metric("boomerang_router_handles_stored_total") == 1:
            break
        await asyncio.sleep(0.01)
    pool.set_urls([])  # the pod went not-ready: discovery removes it
    w.fabric.held.clear()  # and it restarts without its blocks
    pool.set_urls([d_url])
    pool.succeeded(pool.endpoints[d_url], probe=True)
    await next_turn_recomputes(w, history, first)


async def test_a_turn_cancelled_while_p_may_read_its_handle_never_offers_it_again(
    world: Any,
) -> None:
    w = await world()
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    await filed(w, 1)
    w.prefill[0].delay_s = 5.0  # P holds the request carrying D's params
    nxt = [*history, first["choices"][0]["message"], {"role": "user", "content": "q"}]
    gone = asyncio.create_task(post(w, chat(nxt, conversation_id="c")))
    for _ in range(200):
        if len(w.prefill[0].calls) == 2:
            break
        await asyncio.sleep(0.01)
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"]  # P has it
    gone.cancel()  # the client goes away mid-prefill
    await asyncio.gather(gone, return_exceptions=True)
    for _ in range(200):
        if await w.reuse("fallback"):
            break
        await asyncio.sleep(0.01)
    assert await w.reuse("fallback") == 1 and await w.reuse("hit") == 0
    store = w.client.server.app[ROUTER].store
    found, _ = await store.take(conv.id_key(ANONYMOUS, "c"), time.time())
    assert found == "missing"  # spent, not restored


async def test_requests_that_every_prefill_engine_fails_eject_none(world: Any) -> None:
    """A 5xx from both P engines is the request's doing: four such requests in a row (past
    eject_after) leave both engines in, and the next request is served."""
    w = await world(n_prefill=2, single_engine_fallback=False)
    w.prefill[0].fail_status = w.prefill[1].fail_status = 500
    for i in range(4):
        status, _ = await post(w, chat([{"role": "user", "content": f"bad {i}"}]))
        assert status == 502
    assert await w.metric("boomerang_router_ejections_total", role="prefill") == 0
    assert await w.metric("boomerang_router_request_caused_failures_total", role="prefill") == 8
    w.prefill[0].fail_status = w.prefill[1].fail_status = None
    status, _ = await post(w, chat([{"role": "user", "content": "good"}]))
    assert status == 200
