"""What P counts when its pull of D's blocks fails (issue 47), on the vLLM CPU P/D pair: P is
sent a handle whose decoder was killed, so its NIXL read fails and, under
`kv_load_failure_policy: recompute`, it computes the history itself. Its usage then counts
only what its own prefix cache held, which is how the router tells a failed pull from a hit
(`usage.pull_failed`: the turn is a fallback, and its usage is P's count). The same request
with a live decoder counts the whole history."""

from __future__ import annotations

import random

import pdclient
import pytest
from dataplane.restart import start_decoder
from dataplane.turns import words

from boomerang.router.usage import pull_failed

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

BLOCK = 128


def cached_by_p(plane, prompt: list[int], handle: dict) -> int:
    """P's own count of the prompt tokens it did not compute, sent `handle` to pull."""
    body = {**pdclient.completion_body(plane.model, prompt, 1), "stream": False}
    body["kv_transfer_params"] = handle
    usage = pdclient.post(f"{plane.p_url}/v1/completions", body, 900.0)["usage"]
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def next_prompt(plane, rng: random.Random) -> tuple[list[int], dict]:
    """A P/D turn's next prompt (its history, the answer, a few more words) and D's handle."""
    history = words(rng, 700)
    turn = pdclient.pd_turn(plane.p_url, plane.d_url, plane.model, history, None, 8)
    handle = pdclient.next_handle(turn.handle)
    assert handle is not None
    return history + turn.tokens + words(rng, 40), handle


def test_p_counts_only_what_it_took_when_its_pull_fails(dataplane) -> None:
    router = dataplane.router("router-failed-pull")  # to know when D is back
    rng = random.Random(4711)
    prompt, handle = next_prompt(dataplane, rng)
    pulled = int(handle["remote_num_tokens"])
    dataplane.kill("decode")  # P's read of D's blocks now fails
    try:
        failed = cached_by_p(dataplane, prompt, handle)
    finally:
        start_decoder(dataplane, router)
    assert pull_failed(failed, pulled, BLOCK), (failed, pulled)

    prompt, handle = next_prompt(dataplane, rng)  # the control: D alive, the pull works
    pulled = int(handle["remote_num_tokens"])
    worked = cached_by_p(dataplane, prompt, handle)
    assert not pull_failed(worked, pulled, BLOCK), (worked, pulled)
