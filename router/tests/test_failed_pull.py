"""A pull that failed on P (issue 47): vLLM recomputes (`kv_load_failure_policy: recompute`)
and its own count of cached prompt tokens then says so. The turn is served, its usage reports
what P counted, and it counts as a fallback (not a hit, no reused tokens), with
`boomerang_router_failed_pulls_total`; the next pull that works is a hit again."""

from __future__ import annotations

from typing import Any

from router_testing import chat, filed, post

LONG = "tell me everything about the harbour at dawn, the boats and the gulls " * 4


async def test_a_pull_p_did_not_take_is_a_fallback_with_p_s_own_count(world: Any) -> None:
    w = await world(prefill_spec={"failed_loads": 1})
    history = [{"role": "user", "content": LONG}]
    _, first = await post(w, chat(history, conversation_id="c"))
    await filed(w, 1)
    history += [first["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    status, second = await post(w, chat(history, conversation_id="c"))
    assert status == 200  # served: P recomputed what it could not pull
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # P's own count
    assert await w.metric("boomerang_router_failed_pulls_total") == 1
    assert await w.reuse("fallback") == 1 and await w.reuse("hit") == 0
    assert await w.metric("boomerang_router_reused_tokens_total", outcome="hit") == 0
    await filed(w, 2)
    history += [second["choices"][0]["message"], {"role": "user", "content": "go on"}]
    status, third = await post(w, chat(history, conversation_id="c"))
    assert status == 200
    assert await w.reuse("hit") == 1  # the next pull worked
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert await w.metric("boomerang_router_failed_pulls_total") == 1
