"""What a turn sent straight to the decoder does on the real engine (vLLM CPU 0.32, NIXL).

The adaptive reuse work (a third path beside pull and recompute: continue on the D that holds
the history) rests on three facts of the engine, checked here: a plain request to D with empty
KV-transfer intent (`do_remote_prefill` and `do_remote_decode` both false) is served from D's
own cache for the history D holds and computes only the rest; its answer equals one engine
computing the whole prompt; and D, with bidirectional transfer on, answers with a fresh handle
for its blocks, which the next turn's P can pull as after any P/D turn. D's scheduler keeps
such a request's blocks for the decoder TTL; on 0.32 only Boomerang's plugin makes D's worker
free them again (`boomerang.connector.plugin.own_requests`, `test_own_requests_freed.py`).
"""

from __future__ import annotations

import random

import pytest
from dataplane.turns import MAX_TOKENS, same, words

from boomerang.local import pdclient
from boomerang.local.engine_client import completion_body, post, scrape, tokens_by_source

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

ON_DECODE = {"do_remote_prefill": False, "do_remote_decode": False}


def counted(url: str, before: dict[str, float]) -> dict[str, float]:
    after = tokens_by_source(scrape(url))
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def test_a_turn_on_the_decoder_reuses_its_cache_matches_and_leaves_a_pullable_handle(dataplane):
    p, d, model = dataplane.p_url, dataplane.d_url, dataplane.model
    rng = random.Random(2026)
    history = words(rng, 700)
    first = pdclient.pd_turn(p, d, model, history, None, max_tokens=MAX_TOKENS)
    assert first.handle is not None

    prompt = history + first.tokens + words(rng, 30)
    before = tokens_by_source(scrape(d))
    body = {**completion_body(model, prompt, MAX_TOKENS), "stream": False}
    resp = post(f"{d}/v1/completions", {**body, "kv_transfer_params": dict(ON_DECODE)})
    served = counted(d, before)
    choice = resp["choices"][0]
    tokens, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]

    assert served.get("local_cache_hit", 0.0) >= len(history) - 128  # whole blocks of it
    assert served.get("local_compute", 0.0) <= len(prompt) - len(history) + 128
    reference = pdclient.single_turn(p, model, prompt, max_tokens=MAX_TOKENS)
    assert same((tokens, logprobs), (reference.tokens, reference.logprobs))

    handle = pdclient.next_handle(resp.get("kv_transfer_params"))
    assert handle is not None and handle["remote_block_ids"]
    assert handle["remote_num_tokens"] >= len(prompt)

    after = prompt + tokens + words(rng, 40)
    pulled_before = pdclient.external_tokens(scrape(p))
    third = pdclient.pd_turn(p, d, model, after, handle, max_tokens=MAX_TOKENS)
    assert pdclient.external_tokens(scrape(p)) - pulled_before >= len(prompt) - 128
    reference = pdclient.single_turn(p, model, after, max_tokens=MAX_TOKENS)
    assert same((third.tokens, third.logprobs), (reference.tokens, reference.logprobs))
