"""The router's KV index on real engines: two prefill engines and a decoder publish their KV
events, and a prompt goes to the P that holds its prefix.

Conversations share a long system prompt. The first lands on some P; from then on the index
knows that P holds the system prompt's blocks, so every later conversation's first turn goes
there too and P serves those blocks from its own cache (vLLM's `local_cache_hit` tokens), as a
single P would. Two router replicas build the same index from the same events; every answer
equals a single engine's on the same prompt (greedy, float32).
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from production.stacks import answer, completion, manifest

from boomerang.facts import state as router_state
from boomerang.local import pdclient
from boomerang.local.engine_client import totals

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]
SYSTEM = 1024  # eight whole blocks shared by every conversation
CONVERSATIONS = 6


@pytest.fixture(scope="module")
def engines(stack_of: Any) -> Any:
    return stack_of(manifest(prefill={"replicas": 2}))


def cache_hits(urls: list[str]) -> float:
    by = "vllm:prompt_tokens_by_source_total"
    return sum(totals(pdclient.scrape(u), by, "source").get("local_cache_hit", 0.0) for u in urls)


def index_of(router: str) -> dict[str, Any]:
    return pdclient.get_json(router + router_state.PATH).get(router_state.KV_INDEX) or {}


def p_holds(router: str, prefill: list[str]) -> bool:
    """The index knows a P that holds the system prompt's blocks."""
    held = index_of(router).get("engines") or {}
    return any(held.get(p, 0) >= SYSTEM // 128 for p in prefill)


def test_prompts_go_where_their_prefix_is_and_replicas_agree(engines: Any) -> None:
    from bench.production import run as bench_production

    model = engines.dd.spec.model.served_name
    rng = random.Random(3)
    system = [rng.randrange(16, 8000) for _ in range(SYSTEM)]
    prompts = [system + [rng.randrange(16, 8000) for _ in range(40)] for _ in range(CONVERSATIONS)]
    before = cache_hits(engines.prefill)
    with (
        bench_production.router(engines, "a", {}, port=38081) as a,
        bench_production.router(engines, "b", {}, port=38082) as b,
    ):
        answers = []
        for i, prompt in enumerate(prompts):
            answers.append(answer(completion(a, model, prompt, f"c{i}")))
            deadline = time.monotonic() + 10  # P's events of this turn reach the index
            while time.monotonic() < deadline and not p_holds(a, engines.prefill):
                time.sleep(0.1)
        hits = cache_hits(engines.prefill) - before
        # A single P serves the system prompt from its cache on every conversation but the first.
        assert hits >= 0.9 * SYSTEM * (CONVERSATIONS - 1), hits
        assert index_of(a)["usable"] and index_of(a)["blocks"] > 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and index_of(a)["engines"] != index_of(b)["engines"]:
            time.sleep(0.5)
        assert index_of(a)["engines"] == index_of(b)["engines"]
    for prompt, got in zip(prompts, answers, strict=True):
        assert got[0] == answer(completion(engines.prefill[0], model, prompt, None))[0]


def chat(url: str, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0.0}
    return pdclient.post(f"{url}/v1/chat/completions", body, 600)


def test_an_edited_first_message_reuses_the_system_prompt_with_no_conversation_id(
    engines: Any,
) -> None:
    """A client edits the first user message of its chat and sends it again, with no
    conversation id: no handle matches it, but the system prompt's blocks are where the index
    says they are, and P serves them from its cache."""
    from bench.production import run as bench_production

    model = engines.dd.spec.model.served_name
    rng = random.Random(11)
    system = " ".join(f"rule {rng.randrange(10**6)} applies" for _ in range(250))
    with bench_production.router(engines, "edit", {}, port=38083) as router:
        first = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
        tokens = len(
            pdclient.post(
                f"{engines.prefill[0]}/tokenize", {"model": model, "messages": first[:1]}
            )["tokens"]
        )
        # The index already holds the earlier test's blocks (replayed when this router
        # subscribed): wait for that, then for this system prompt's own blocks on some P.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not p_holds(router, engines.prefill):
            time.sleep(0.1)
        held = index_of(router).get("engines") or {}
        reply = chat(router, model, first)["choices"][0]["message"]

        def stored() -> bool:
            now = index_of(router).get("engines") or {}
            return any(now.get(p, 0) - held.get(p, 0) >= tokens // 128 for p in engines.prefill)

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not stored():
            time.sleep(0.1)
        assert stored(), "no P's KV events named the system prompt's blocks within 10 s"
        before = cache_hits(engines.prefill)
        edited = [first[0], {"role": "user", "content": "good evening"}, reply]
        chat(router, model, [*edited, {"role": "user", "content": "and then?"}])
        hits = cache_hits(engines.prefill) - before
    assert hits >= tokens - 2 * 128, (hits, tokens)  # every whole block of the system prompt
