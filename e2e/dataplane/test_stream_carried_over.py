"""A stream carried over when its decoder dies (issue 47), through the router and the vLLM CPU
P/D pair: D is killed with SIGKILL while it streams an answer at temperature 0, and the client
still gets one stream, with no error, whose tokens are exactly those of one engine computing
the whole answer alone, and one usage that adds up. The router sent P (the only engine left)
the prompt plus the tokens already streamed, as ids (`migration.py`)."""

from __future__ import annotations

import random

import pytest
from dataplane.restart import start_decoder
from dataplane.turns import words

from boomerang.local import pdclient
from boomerang.local.engine_client import totals

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

MAX = 1000
KILL_AFTER = 12
"""Tokens the client has when D is killed: well before D's last. D streams ~150 a second, so
a 200-token answer was once all computed by the time a client on a loaded host had read 12:
nothing was left to carry over."""


def carried(router: str) -> float:
    counts = totals(
        pdclient.scrape(router), "boomerang_router_streams_carried_over_total", "outcome"
    )
    return counts.get("carried", 0.0)


def test_a_stream_whose_decoder_is_killed_goes_on_token_for_token(dataplane) -> None:
    router = dataplane.router("router-carry")
    prompt = words(random.Random(4701), 300)
    reference = pdclient.single_turn(dataplane.p_url, dataplane.model, prompt, MAX)
    body = {
        **pdclient.completion_body(dataplane.model, prompt, MAX),
        "stream": True,
        "stream_options": {"include_usage": True},
        "conversation_id": "carried",
    }
    tokens: list[int] = []
    usages, errors, ids = [], [], set()
    killed = False
    try:
        for _t, chunk in pdclient.stream_events(f"{router}/v1/completions", body):
            errors += [chunk["error"]] if "error" in chunk else []
            ids.add(chunk.get("id"))
            usages += [chunk["usage"]] if chunk.get("usage") else []
            for choice in chunk.get("choices") or ():
                tokens += choice.get("token_ids") or []
            if not killed and len(tokens) >= KILL_AFTER:
                dataplane.kill("decode")  # SIGKILL to D's process group, mid-stream
                killed = True
    finally:
        if killed:
            start_decoder(dataplane, router)  # later tests find the plane as it was
    assert killed and errors == [], errors
    assert len(ids) == 1  # one stream, one id
    assert tokens == reference.tokens  # the same answer, token for token
    assert carried(router) == 1.0
    (usage,) = usages
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt), MAX)
