"""Bad input gets a clear 4xx and never a 5xx or a crash (fuzzed with hypothesis)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_degraded import pool

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "messages",
        "prompt",
        "model",
        "stream",
        "n",
        "max_tokens",
        "stream_options",
        "conversation_id",
        "kv_transfer_params",
        "return_token_ids",
        "tools",
        "best_of",
    ]
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "bogus", 3])},
    optional={"content": json_values, "tool_calls": json_values},
)
bodies = st.one_of(
    json_values,
    st.dictionaries(field_names, json_values, max_size=6),
    st.fixed_dictionaries(
        {"messages": st.lists(message, max_size=3)},
        optional={"stream": json_values, "n": json_values, "conversation_id": json_values},
    ),
)


async def test_fuzzed_bodies_never_get_a_5xx(world: Any) -> None:
    w = await world()
    seen: list[int] = []

    @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    def run(body: Any, path: str) -> None:
        seen.append(0)
        bodies_seen.append((path, body))

    bodies_seen: list[tuple[str, Any]] = []
    run()
    for path, body in bodies_seen:
        resp = await w.client.post(
            path, data=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        assert resp.status < 500, (body, await resp.text())
        if resp.status >= 400:
            err = (await resp.json())["error"]
            assert err["message"]
    assert (await w.client.get("/health")).status == 200


async def test_raw_garbage_is_a_400(world: Any) -> None:
    w = await world()
    for raw in (b"", b"{", b"\xff\xfe", b"[1,2]", b"null", b'"x"'):
        resp = await w.client.post("/v1/chat/completions", data=raw)
        assert resp.status == 400, raw
        assert "error" in await resp.json()


async def test_oversized_body_is_a_413(world: Any) -> None:
    w = await world(max_request_bytes=2048)
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    resp = await w.client.post("/v1/chat/completions", json=big)
    assert resp.status == 413
    assert (await resp.json())["error"]["type"] == "request_too_large"


async def test_errors_name_the_bad_parameter(world: Any) -> None:
    w = await world()
    resp = await w.client.post("/v1/chat/completions", json={"messages": [{"role": "robot"}]})
    body = await resp.json()
    assert resp.status == 400 and body["error"]["param"] == "messages[0].role"
    resp = await w.client.post("/v1/completions", json={"prompt": "x", "n": "two"})
    assert (await resp.json())["error"]["param"] == "n"


async def test_wrong_model_is_a_404(world: Any) -> None:
    w = await world(model="served")
    resp = await w.client.post("/v1/completions", json={"prompt": "x", "model": "other"})
    assert resp.status == 404


async def test_integers_beyond_64_bits_are_refused_not_rounded(world: Any) -> None:
    """A fast JSON parser reads 2**70 as a float; the router must not forward a changed number."""
    w = await world()
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for field, value in (("seed", 2**70), ("seed", -(2**63) - 1), ("max_tokens", 10**30)):
        raw = json.dumps({**chat, field: value})
        resp = await w.client.post("/v1/chat/completions", data=raw)
        body = await resp.json()
        assert resp.status == 400, (field, value, body)
        assert body["error"]["param"] == field, body
        assert "64-bit" in body["error"]["message"]
    resp = await w.client.post("/v1/completions", data=json.dumps({"prompt": [1, 2**64, 3]}))
    assert resp.status == 400 and (await resp.json())["error"]["param"] == "prompt[1]"
    assert not w.prefill[0].calls, "a refused request reached an engine"

    # In range, and long digit runs inside strings, pass through exactly.
    digits = "1234567890" * 4
    raw = json.dumps({**chat, "seed": 2**63 - 1, "user": digits})
    resp = await w.client.post("/v1/chat/completions", data=raw)
    assert resp.status == 200, await resp.text()
    forwarded = w.decode[0].calls[-1]
    assert forwarded["seed"] == 2**63 - 1 and isinstance(forwarded["seed"], int)
    assert forwarded["user"] == digits


async def test_a_client_s_transfer_params_never_reach_an_engine(world: Any) -> None:
    """vLLM reads `kv_transfer_params` from `vllm_xargs` too when the top-level field is
    absent (one engine alone): a client's there would reach the engine's connector. They are
    stripped wherever a client can put them, for every API and leg; other xargs stay."""
    forged = {"do_remote_prefill": True, "remote_block_ids": [1], "remote_engine_id": "x"}
    xargs = {"kv_transfer_params": forged, "ec_transfer_params": {}, "mine": 1}
    bodies = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
        "/v1/completions": {"prompt": "hi"},
        "/v1/messages": {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        "/v1/responses": {"input": "hi"},
    }
    for alone in (False, True):  # P then D, and D alone
        w = await world()
        if alone:
            pool(w, "prefill").set_urls([])  # the only P pod restarts: discovery lists none
        for path, body in bodies.items():
            extra = {"model": "fake", "vllm_xargs": xargs, "kv_transfer_params": forged}
            resp = await w.client.post(path, json={**body, **extra})
            assert resp.status == 200, (path, await resp.text())
        calls = [c for e in (*w.prefill, *w.decode) for c in e.calls]
        assert len(calls) >= 4
        for call in calls:
            assert call.get("vllm_xargs") == {"mine": 1}, call
            assert (call.get("kv_transfer_params") or {}).get("remote_engine_id") != "x"
