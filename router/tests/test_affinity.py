"""Conversation affinity (`affinity.py`): a turn goes to the engines that served the previous
one, whose prefix caches hold its history, unless the load says otherwise; in every mode,
with or without D->P reuse, for conversations found by id or by fingerprint."""

from __future__ import annotations

from typing import Any

import pytest
from fake_tokenizer import render_chat
from router_testing import chat, d_caches, filed, post
from test_paths import router_of

from boomerang.router.app import ROUTER
from boomerang.router.engines.endpoints import Endpoint, LeastWorkAffinity
from boomerang.router.turn.affinity import Affinity, Placement, cached_tokens


def test_placements_expire_and_the_least_recently_used_go_first() -> None:
    a = Affinity(capacity=2, ttl_s=10.0)
    for i, key in enumerate((b"a", b"b", b"c")):
        a.put(key, Placement(f"p{i}", f"d{i}", 100 * i, at=float(i)))
    assert a.get(b"a", 3.0) is None and len(a) == 2  # evicted: capacity 2
    assert a.get(b"c", 11.0) is not None and a.get(b"c", 13.0) is None  # expired
    assert a.get(None, 0.0) is None


def test_the_cached_prompt_is_cut_to_whole_blocks() -> None:
    placement = Placement("p0", "d0", 300, 0.0)
    assert cached_tokens(placement, 128) == {"p0": 256}
    assert cached_tokens(placement, None) == {"p0": 300}
    assert cached_tokens(None, 128) == {}


@pytest.mark.parametrize(
    ("work", "expected"),
    [((0.0, 0.0), "p0"), ((2000.0, 0.0), "p0"), ((4000.0, 0.0), "p1")],
)
def test_p_is_chosen_by_the_work_left_counting_its_cache(work, expected) -> None:
    eps = [Endpoint("p0", "prefill", work=work[0]), Endpoint("p1", "prefill", work=work[1])]
    chosen = LeastWorkAffinity().prefill(eps, {"p0": 3000}, prompt_tokens=3100.0)
    assert chosen.url == expected  # p0 holds 3000 of 3100 tokens: worth up to ~3000 of queue


async def conversation_turns(w: Any, turns: int, **extra: Any) -> None:
    messages = [{"role": "user", "content": "hello there " * 20}]
    for _ in range(turns):
        status, body = await post(w, chat(messages, **extra))
        assert status == 200, body
        messages = [*messages, body["choices"][0]["message"], {"role": "user", "content": "go"}]


@pytest.mark.parametrize("bidirectional", [True, False])
async def test_a_conversation_stays_on_its_engines(world: Any, bidirectional: bool) -> None:
    w = await world(n_prefill=2, n_decode=2, bidirectional=bidirectional, affinity=True)
    await conversation_turns(w, 4)  # no conversation id: found by fingerprint
    counts = [len(e.calls) for e in w.prefill], [len(e.calls) for e in w.decode]
    assert sorted(counts[0]) == [0, 4] and sorted(counts[1]) == [0, 4]


async def test_without_affinity_plain_turns_spread(world: Any) -> None:
    w = await world(n_prefill=2, n_decode=2, bidirectional=False, affinity=False)
    await conversation_turns(w, 4)
    assert [len(e.calls) for e in w.prefill] == [2, 2]


async def test_the_p_whose_cache_holds_the_prompt_serves_it(world: Any) -> None:
    """Another conversation's P holds this prompt's long system prompt (the KV index says so):
    a first turn, with no placement, goes there."""
    w = await world(n_prefill=2, n_decode=1, affinity=True)
    system = {"role": "system", "content": "you are a careful assistant " * 40}
    messages = [system, {"role": "user", "content": "hello"}]
    d_caches(w, render_chat(messages)[:-40], i=1, role="prefill")  # the shared blocks, on P1
    for _ in range(3):
        status, body = await post(w, chat(messages))
        assert status == 200, body
    assert [len(e.calls) for e in w.prefill] == [0, 3]


async def test_an_index_that_hashes_otherwise_is_not_consulted(world: Any) -> None:
    w = await world(n_prefill=2, n_decode=1, affinity=False)
    w.client.server.app[ROUTER].kv.usable = False
    messages = [{"role": "user", "content": "hello " * 50}]
    for _ in range(4):
        await post(w, chat(messages))
    assert [len(e.calls) for e in w.prefill] == [2, 2]  # least work, ties rotating
    assert all(e.tokenize_calls == 0 for e in w.prefill)  # nothing to steer: no tokenize


async def test_static_lets_the_handle_go_unverified_when_p_holds_the_history(world: Any) -> None:
    """The P that computed the last prompt serves the turn: its cache has the history, and D's
    handle could only bring back D's last answer; no verify call, no claim, no pull."""
    w = await world(affinity=True)
    _, retention = router_of(w)
    messages = [{"role": "user", "content": "hello there " * 20}]
    status, body = await post(w, chat(messages))
    assert status == 200, body
    await filed(w, 1)
    messages = [*messages, body["choices"][0]["message"], {"role": "user", "content": "go"}]
    status, body = await post(w, chat(messages))
    assert status == 200, body
    assert w.prefill[0].tokenize_calls == 0  # not verified
    assert not (w.prefill[0].calls[-1].get("kv_transfer_params") or {}).get("remote_block_ids")
    assert await w.reuse("fallback") == 1
    assert [why for _h, why in retention.released()] == ["recompute"]  # D's blocks let go


@pytest.mark.parametrize("queued_blocks", [0, 8])
async def test_static_pulls_when_the_work_queued_on_p_will_have_evicted_the_history(
    world: Any, queued_blocks: int
) -> None:
    """P holds the history now, but 8 blocks of work are queued before the turn on a P of 8
    blocks: by the time it runs the history is gone (`forgetting.py`), so the handle is
    verified and pulled instead of forgone. With nothing queued the handle is let go."""
    w = await world(affinity=True, prefill_spec={"kv_blocks": 8})
    router, _ = router_of(w)
    messages = [{"role": "user", "content": "hello there " * 20}]
    status, body = await post(w, chat(messages))
    assert status == 200, body
    await filed(w, 1)
    (p_ep,) = router.prefill.endpoints.values()
    assert p_ep.kv_blocks == 8 and p_ep.block_size == 16  # P's sizes, read from its /metrics
    p_ep.kv_tokens += queued_blocks * 16  # other turns' prompts, sent and not yet answered
    messages = [*messages, body["choices"][0]["message"], {"role": "user", "content": "go"}]
    status, body = await post(w, chat(messages))
    assert status == 200, body
    p_ep.kv_tokens -= queued_blocks * 16
    pulled = (w.prefill[0].calls[-1].get("kv_transfer_params") or {}).get("remote_block_ids")
    if queued_blocks:
        assert pulled and await w.reuse("fallback") == 0
    else:
        assert not pulled and await w.reuse("fallback") == 1
