"""A pull that failed on P (issue 47): vLLM recomputes (`kv_load_failure_policy: recompute`)
and its own count of cached prompt tokens then says so. The turn is served, its usage reports
what P counted, and it counts as a fallback (not a hit, no reused tokens), with
`boomerang_router_failed_pulls_total`; the next pull that works is a hit again. Judged only
once P has stated a cached count (vLLM leaves a zero out, and an engine without
`--enable-prompt-tokens-details` never states one)."""

from __future__ import annotations

from typing import Any

from router_testing import chat, filed, post

LONG = "tell me everything about the harbour at dawn, the boats and the gulls " * 4


async def _turns(w: Any, n: int, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`n` more turns of one conversation; their answers."""
    answers = []
    for _ in range(n):
        status, body = await post(w, chat(history, conversation_id="c"))
        assert status == 200, body
        answers.append(body)
        await filed(w, len(history) // 2 + 1)
        history += [body["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    return answers


async def test_a_pull_p_did_not_take_is_a_fallback_with_p_s_own_count(world: Any) -> None:
    w = await world()
    history: list[dict[str, Any]] = [{"role": "user", "content": LONG}]
    await _turns(w, 2, history)  # a first turn, then a pull P counts: P states its count
    assert await w.reuse("hit") == 1
    w.prefill[0].failed_loads = 1
    (failed,) = await _turns(w, 1, history)
    assert failed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # P's own count
    assert await w.metric("boomerang_router_failed_pulls_total") == 1
    assert await w.reuse("fallback") == 1 and await w.reuse("hit") == 1
    (worked,) = await _turns(w, 1, history)
    assert await w.reuse("hit") == 2  # the next pull worked
    assert worked["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert await w.metric("boomerang_router_failed_pulls_total") == 1


async def test_no_pull_is_judged_before_p_has_stated_a_count(world: Any) -> None:
    w = await world(prefill_spec={"failed_loads": 1})
    history: list[dict[str, Any]] = [{"role": "user", "content": LONG}]
    await _turns(w, 2, history)  # its first pull fails, but P never stated a count yet
    assert await w.metric("boomerang_router_failed_pulls_total") == 0
    assert await w.reuse("hit") == 1
