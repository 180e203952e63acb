"""A decoder that retains blocks and serves nothing stays idle, and still serves a pull and a
release at once (`boomerang.connector.plugin.idle_loop`, on by default in every engine).

vLLM's engine loop alone steps about every millisecond while D keeps finished requests' blocks
for the next turn, and its worker spins on `sched_yield()` after each step: most of a core for
the whole TTL. With the idle wait the loop blocks on its input queue between idle steps (every
30 s). P's read of D's blocks needs no step (NIXL's progress thread serves it), and an input
(the lease API's release, a new request) wakes the loop for a step at once.
"""

from __future__ import annotations

import random
import time

import pytest
from dataplane.leasing import eventually, metric
from dataplane.turns import MAX_TOKENS, same, words

from boomerang.connector.plugin.idle_policy import DEFAULT_IDLE_STEP_S
from boomerang.local import pdclient
from boomerang.local.engine_client import lease_status, scrape

from bench.harness import proc_cpu

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

USAGE = "vllm:kv_cache_usage_perc"
WINDOW_S = 20.0
"""Shorter than the idle period, so D does not step inside it: the floor while it sleeps
(`make bench-idle` measures 60 s, idle steps included)."""
IDLE_CPU_MAX = 0.10
"""Cores D's processes may use while they retain and serve nothing (measured: see the
connector README, "CPU problems found")."""
SETTLE_S = 3.0
"""D's worker spins for vLLM's 1 s window after D's last step."""


def test_a_retaining_decoder_sleeps_and_still_serves_a_pull_and_a_release(dataplane):
    p, d, model, token = dataplane.p_url, dataplane.d_url, dataplane.model, dataplane.lease_token
    rng = random.Random(3601)
    history = words(rng, 700)
    first = pdclient.pd_turn(p, d, model, history, None, MAX_TOKENS)
    prompt = history + first.tokens + words(rng, 40)
    second = pdclient.pd_turn(p, d, model, prompt, first.handle, MAX_TOKENS)
    assert second.handle is not None
    time.sleep(SETTLE_S)
    assert metric(d, USAGE) > 0  # D retains the chat's blocks

    cpu = proc_cpu.measure({"D": dataplane.pids["decode"]}, WINDOW_S)["D"]
    print(
        f"D while retaining, {WINDOW_S:.0f} s: " + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items())
    )
    assert cpu["total"] < IDLE_CPU_MAX

    # P pulls D's blocks while D sleeps: no idle step needed, so well inside one period.
    follow = prompt + second.tokens + words(rng, 40)
    pulled_before = pdclient.external_tokens(scrape(p))
    started = time.monotonic()
    third = pdclient.pd_turn(p, d, model, follow, second.handle, MAX_TOKENS)
    took = time.monotonic() - started
    pulled = pdclient.external_tokens(scrape(p)) - pulled_before
    print(f"follow-up while D slept: {took:.2f} s, TTFT {third.ttft_s:.3f} s, pulled {pulled:.0f}")
    assert took < DEFAULT_IDLE_STEP_S
    assert pulled >= len(prompt) - 128  # the history, in whole blocks
    reference = pdclient.single_turn(p, model, follow, max_tokens=MAX_TOKENS)
    assert same((third.tokens, third.logprobs), (reference.tokens, reference.logprobs))

    # A release while D sleeps frees the blocks at once (the lease API test's bound).
    assert third.handle is not None
    time.sleep(SETTLE_S)
    holding = metric(d, USAGE)
    rid = third.handle["remote_request_id"]
    started = time.monotonic()
    status, body = lease_status(d, token, "release", {"request_ids": [rid]})
    assert (status, body) == (200, {"released": [rid], "unknown": []})
    assert eventually(lambda: metric(d, USAGE) < holding, within_s=2.0)
    print(f"release while D slept: blocks freed in {time.monotonic() - started:.2f} s")
