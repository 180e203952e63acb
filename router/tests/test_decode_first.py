"""Decode-first routing, the peers' policy the benchmark compares against (`decode_first.py`):
the rule as a table, then through the router with fake engines: a short remainder on the
decoder that caches the history, alone; a long one (or an uncached prompt) through P."""

from __future__ import annotations

from typing import Any

import pytest
from fake_tokenizer import render_chat
from router_testing import chat, d_caches, post

from boomerang.router.config import RouterConfig
from boomerang.router.turn.decode_first import DecodeChoice, choose

A, B = "http://d-a", "http://d-b"


@pytest.mark.parametrize(
    ("prompt", "cached", "inflight", "threshold", "expected"),
    [
        # Nothing cached anywhere: the least loaded decoder, through P.
        (1000, {}, {A: 0, B: 0}, 128, DecodeChoice(A, False, 1000)),
        # B caches the history: it serves the 40 tokens it lacks alone.
        (1000, {B: 960}, {A: 0, B: 1}, 128, DecodeChoice(B, True, 40)),
        # The remainder reaches the threshold: P prefills, B still decodes (its cache).
        (1000, {B: 872}, {A: 0, B: 1}, 128, DecodeChoice(B, False, 128)),
        # B is more than `slack` requests busier: its cache does not win it the turn.
        (1000, {B: 960}, {A: 0, B: 5}, 128, DecodeChoice(A, False, 1000)),
        # A cache that claims more than the prompt counts as the whole prompt.
        (100, {A: 128}, {A: 0}, 16, DecodeChoice(A, True, 0)),
        # Equal caches: the less loaded one.
        (1000, {A: 960, B: 960}, {A: 2, B: 1}, 16, DecodeChoice(B, False, 40)),
    ],
)
def test_the_rule(
    prompt: int, cached: dict[str, int], inflight: dict[str, int], threshold: int, expected: Any
) -> None:
    assert choose(prompt, cached, inflight, threshold, slack=4) == expected


@pytest.mark.parametrize(
    ("prompt", "cached", "ratio", "p_busy", "alone"),
    [
        # Dynamo's IslBounding: 600 uncached of 1,000 is under 2,048 and under 0.7: alone.
        (1000, 400, 0.7, False, True),
        # 800 of 1,000 is under 2,048 but 0.8 of the prompt: through P.
        (1000, 200, 0.7, False, False),
        # A short prompt nothing caches: under 2,048 tokens, the whole prompt: through P.
        (300, 0, 0.7, False, False),
        # Exactly the share is not under it.
        (1000, 300, 0.7, False, False),
        # IslOrLoad: P busy, the decoder takes even a prompt it does not cache.
        (5000, 0, 0.7, True, True),
        # P busy, no ratio: llm-d's threshold plus the load gate.
        (5000, 0, None, True, True),
    ],
)
def test_dynamo_variants(prompt: int, cached: int, ratio: Any, p_busy: bool, alone: bool) -> None:
    choice = choose(prompt, {A: cached}, {A: 0}, 2048, slack=4, ratio=ratio, p_busy=p_busy)
    assert choice == DecodeChoice(A, alone, prompt - cached)


def test_the_variants_need_decode_first() -> None:
    urls = {"prefill": {"urls": ["http://p"]}, "decode": {"urls": ["http://d"]}}
    for variant in ({"decode_first_ratio": 0.7}, {"decode_first_p_busy_tokens": 2048}):
        with pytest.raises(ValueError, match="set decode_first_tokens too"):
            RouterConfig.model_validate({**urls, "bidirectional": False, **variant})
    with pytest.raises(ValueError, match="decode_first_ratio"):
        RouterConfig.model_validate(
            {**urls, "bidirectional": False, "decode_first_tokens": 2048, "decode_first_ratio": 1.5}
        )


def test_no_decoder_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one decoder"):
        choose(10, {}, {}, 16, slack=4)


def test_decode_first_needs_bidirectional_off() -> None:
    urls = {"prefill": {"urls": ["http://p"]}, "decode": {"urls": ["http://d"]}}
    with pytest.raises(ValueError, match="set bidirectional false"):
        RouterConfig.model_validate({**urls, "decode_first_tokens": 128})
    cfg = RouterConfig.model_validate({**urls, "decode_first_tokens": 128, "bidirectional": False})
    assert cfg.decode_first_tokens == 128


async def test_a_short_follow_up_runs_on_the_decoder_that_caches_its_history(world: Any) -> None:
    w = await world(n_decode=2, bidirectional=False, affinity=True, decode_first_tokens=64)
    history = [{"role": "user", "content": "tell me about the sea " * 30}]
    d_caches(w, render_chat(history), i=1)  # D1 caches the history (its KV events)
    follow_up = [*history, {"role": "assistant", "content": "it is wide"},
                 {"role": "user", "content": "and deep?"}]  # fmt: skip
    status, body = await post(w, chat(follow_up))
    assert status == 200, body
    assert [len(e.calls) for e in w.prefill] == [0]  # no prefill engine at all
    assert [len(e.calls) for e in w.decode] == [0, 1]
    assert "kv_transfer_params" not in w.decode[1].calls[0]  # a plain request


async def test_a_long_remainder_goes_through_p_to_the_caching_decoder(world: Any) -> None:
    w = await world(n_decode=2, bidirectional=False, affinity=True, decode_first_tokens=64)
    history = [{"role": "user", "content": "tell me about the sea " * 30}]
    d_caches(w, render_chat(history), i=1)
    follow_up = [*history, {"role": "user", "content": "now a long tool result " * 40}]
    status, body = await post(w, chat(follow_up))
    assert status == 200, body
    assert [len(e.calls) for e in w.prefill] == [1]
    assert [len(e.calls) for e in w.decode] == [0, 1]  # decode still prefers its cache
    assert w.decode[1].calls[0]["kv_transfer_params"]["do_remote_prefill"] is True


async def test_an_uncached_first_turn_is_plain_p_d(world: Any) -> None:
    w = await world(bidirectional=False, affinity=True, decode_first_tokens=64)
    status, body = await post(w, chat([{"role": "user", "content": "hello " * 100}]))
    assert status == 200, body
    assert [len(e.calls) for e in w.prefill] == [1]
    assert [len(e.calls) for e in w.decode] == [1]


async def test_a_busy_prefill_engine_sends_an_uncached_turn_to_the_decoder(world: Any) -> None:
    """Dynamo's IslOrLoad: while P has a prompt's worth queued, D serves the turn alone."""
    from boomerang.router.app import ROUTER

    w = await world(
        bidirectional=False, affinity=True, decode_first_tokens=64, decode_first_p_busy_tokens=500
    )
    p_ep = next(iter(w.client.server.app[ROUTER].prefill.endpoints.values()))
    d_caches(w, [7])  # the index knows the block size (no block cached)
    messages = [{"role": "user", "content": "hello " * 100}]
    p_ep.work = 499.0  # under the line: through P
    status, body = await post(w, chat(messages))
    assert status == 200, body
    assert [len(e.calls) for e in w.prefill] == [1]
    p_ep.work = 500.0  # at the line: P is busy, the decoder computes the prompt itself
    status, body = await post(w, chat(messages))
    assert status == 200, body
    assert [len(e.calls) for e in w.prefill] == [1]
    assert [len(e.calls) for e in w.decode] == [2]
    assert "kv_transfer_params" not in w.decode[0].calls[1]
