"""A handle whose lease was released (`Handle.released`) through the router and fake engines.

Retention frees D's blocks early, but D's prefix cache keeps them until it needs the room; the
router keeps such a handle for the continue path alone. What must hold: it is never offered
to P (there is nothing to read), in either mode; a short suffix continues on its decoder and
counts `cached`; a suffix over the continue bound recomputes on P without it; static mode
(after a hot reload from adaptive) treats it as rejected.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from router_testing import chat, d_caches, filed, held_tokens, post
from test_paths import ADAPTIVE, SLOW_P, conversation, router_of

from boomerang.router.apis.protocol import CONTINUE_PARAMS
from boomerang.router.app import ROUTER
from boomerang.router.conversation import Handle, build_handle
from boomerang.router.store import MemoryStore, _pack, _unpack

LONG_SUFFIX = "word " * 3000


async def release_the_handle(w: Any) -> Handle:
    """Mark the conversation's stored handle released, as the retention sweeper leaves it."""
    store = w.client.server.app[ROUTER].store
    assert isinstance(store, MemoryStore)
    (key,) = list(store._items)
    status, handle = await store.take(key, 0.0)
    assert status == "found" and handle is not None
    soft = dataclasses.replace(handle, released=True)
    await store.put(key, soft)
    return soft


def pulled_params(p_call: dict[str, Any]) -> Any:
    return (p_call.get("kv_transfer_params") or {}).get("remote_block_ids")


async def test_a_short_suffix_continues_on_the_decoder_that_held_it(world: Any) -> None:
    w = await world(**ADAPTIVE)
    _, retention = router_of(w, SLOW_P)
    messages = await conversation(w, 1)
    d_caches(w, held_tokens(w))  # its KV events: the released blocks are still cached
    soft = await release_the_handle(w)
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert w.decode[0].calls[-1]["kv_transfer_params"] == CONTINUE_PARAMS
    assert len(w.prefill[0].calls) == 1  # only turn 1 went through P
    assert await w.reuse("cached") == 1 and await w.reuse("hit") == 0
    # Handed over as superseded; retention releases nothing for a released handle (its tests).
    assert retention.released() == [(soft, "superseded")]
    await filed(w, 2)
    fresh = retention.filed_handles()[-1]
    assert not fresh.released and fresh.num_tokens > soft.num_tokens  # pinned again
    assert w.fabric.violations == []


async def test_a_long_suffix_recomputes_without_offering_it_to_p(world: Any) -> None:
    w = await world(recompute_threshold=0, **ADAPTIVE)
    router_of(w, SLOW_P)
    messages = await conversation(w, 1)
    await release_the_handle(w)
    messages[-1] = {"role": "user", "content": LONG_SUFFIX}  # over the continue bound
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert pulled_params(w.prefill[0].calls[-1]) is None  # P computed the whole prompt
    assert all(c["kv_transfer_params"] != CONTINUE_PARAMS for c in w.decode[0].calls)
    assert await w.reuse("fallback") == 1
    assert w.fabric.violations == []


async def test_static_mode_rejects_it(world: Any) -> None:
    w = await world(recompute_threshold=0)
    messages = await conversation(w, 1)
    await release_the_handle(w)
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert pulled_params(w.prefill[0].calls[-1]) is None
    assert await w.reuse("rejected") == 1
    assert w.fabric.violations == []


def test_the_flag_survives_both_stores_encodings() -> None:
    params = {
        "do_remote_decode": True,
        "remote_block_ids": [[0, 1]],
        "remote_request_id": "r1",
        "remote_num_tokens": 32,
    }
    handle = build_handle(params, list(range(32)), "http://d0", 123.0, 16)
    assert handle is not None
    soft = dataclasses.replace(handle, released=True)
    for h in (handle, soft):
        assert Handle.decode(h.encode()) == h  # Redis
        assert _unpack(_pack(h)) == h  # memory
    older = json.dumps(json.loads(soft.encode())[:7]).encode()  # a router before the flag
    assert Handle.decode(older) == handle
    # A pinned handle keeps the 7 fields a router before the flag reads; a released one has
    # an 8th, which such a router refuses (so it never offers it to P).
    assert len(json.loads(handle.encode())) == 7 and json.loads(soft.encode())[7] is True
