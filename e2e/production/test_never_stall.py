"""Retained blocks yield to live work: under KV pressure no turn waits for D's memory.

Real CPU engines with a KV cache of `BLOCKS` blocks each, more conversations than D can
retain, and routers whose timeouts are far above the stall bound (so none can hide a stall),
in both modes. Without the engine plugin's pressure release a turn here waits for blocks until
D's TTL (480 s) ends; with it every turn's time stays under the bound, D says leases yielded
(`boomerang_engine_leases_yielded_total`), no turn falls back to one engine, no claimed lease
is ever read after it yielded (the router claims before offering one), and every answer equals
a single engine's on the same prompt (greedy, float32).
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from production.stacks import answer, completion, manifest

from boomerang.local import pdclient
from boomerang.local.engine_client import samples, totals

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]
BLOCKS = 48
CONVERSATIONS = 12
"""Four at a time: the finished ones' last handles (about 9 blocks each) outgrow D's 48 blocks
by the third wave even in static mode, which releases a handle as soon as P holds its history."""
TURNS = 3
FIRST, SUFFIX = 900, 60
STALL_BOUND_S = 60.0
"""Several times the longest turn's work on P and D on the slowest CPU seen (a 1k-token
prefill took ~2 s there); a wait for D's memory lasts until the decoder TTL, 480 s."""
ROUTER_TIMEOUTS = {"prefill_s": 900.0, "decode_first_byte_s": 900.0, "decode_total_s": 1800.0}


@pytest.fixture(scope="module")
def engines(stack_of: Any) -> Any:
    extra = ["--enforce-eager", "--num-gpu-blocks-override", str(BLOCKS)]
    dd = manifest(model={"maxModelLen": 4096}, engine={"extraArgs": extra})
    return stack_of(dd)


def conversation(router: str, model: str, seed: int, tag: str) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    prompt = [rng.randrange(16, 8000) for _ in range(FIRST)]
    turns = []
    for _ in range(TURNS):
        start = time.perf_counter()
        resp = completion(router, model, prompt, f"{tag}-{seed}")
        turns.append(
            {"prompt": list(prompt), "answer": answer(resp), "s": time.perf_counter() - start}
        )
        prompt += resp["choices"][0]["token_ids"] + [rng.randrange(16, 8000) for _ in range(SUFFIX)]
    return turns


def yielded(d_urls: list[str]) -> float:
    return sum(
        s.value
        for d in d_urls
        for s in samples(pdclient.scrape(d), "boomerang_engine_leases_yielded_total")
    )


@pytest.mark.parametrize("mode", ["static", "adaptive"])
def test_no_turn_waits_for_retained_blocks(engines: Any, mode: str) -> None:
    from bench.production import run as bench_production

    model = engines.dd.spec.model.served_name
    before = yielded(engines.decode)
    tuning = {"mode": mode, "itl_budget_s": 0.5}
    with bench_production.router(
        engines, mode, {"tuning": tuning, "timeouts": ROUTER_TIMEOUTS}
    ) as router:
        with ThreadPoolExecutor(4) as pool:
            done = list(
                pool.map(lambda i: conversation(router, model, i, mode), range(CONVERSATIONS))
            )
        page = pdclient.scrape(router)
    turns = [t for conv in done for t in conv]
    slow = [round(t["s"], 1) for t in turns if t["s"] > STALL_BOUND_S]
    assert slow == [], f"turns over the stall bound: {slow}"
    assert yielded(engines.decode) > before, "D never ran out of blocks: no pressure was tested"
    assert sum(totals(page, "boomerang_router_degraded_turns_total", "missing").values()) == 0
    claims = totals(page, "boomerang_router_claims_total", "result")
    assert claims.get("failed", 0) == 0
    p = engines.prefill[0]
    for t in turns:  # the same prompt on one engine alone
        assert t["answer"][0] == answer(completion(p, model, t["prompt"], None))[0]
