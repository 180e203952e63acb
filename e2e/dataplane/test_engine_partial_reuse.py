"""Partial reuse through the real stack: a turn that diverges from what D holds reuses exactly
the whole blocks of the common prefix, and its output is still a single engine's.

Every case computes what must be reused from the token ids themselves: D holds the first
`len(prompt) + len(output) - 1` ids of the previous turn (its last sampled token never went
through the model); the longest common prefix with the new prompt, cut to whole blocks of D's
block size (read from D's own `vllm:cache_config_info`) and leaving P at least one token to
compute, is what P must pull: P's `prompt_tokens_by_source{source="external_kv_transfer"}`
must grow by exactly that (P runs without a prefix cache), no more and no less. The cases are
the ones that made all-or-nothing reuse useless: a thinking model's template dropping the
reasoning (the builtin model's template does what Qwen3's does), an edited last user message,
a reply that re-tokenises differently, and a regenerated turn.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from dataplane.turns import (
    chat_body,
    chat_reference,
    counted,
    reference,
    reuse,
    router_completion,
    same,
    words,
)

from boomerang.local import pdclient
from boomerang.local.engine_client import samples

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

THRESHOLD = 64
"""The engines' and the router's default recompute threshold (examples/local-cpu.yaml)."""
SYSTEM = "You are a careful assistant; think before you answer. " * 40


@pytest.fixture(scope="module")
def router(dataplane) -> str:
    return dataplane.router("router-partial")


@pytest.fixture(scope="module")
def block(dataplane) -> int:
    found = samples(pdclient.scrape(dataplane.d_url), "vllm:cache_config_info")
    assert found, "D exports no cache_config_info"
    return int(found[0].labels["block_size"])


def expected(held: list[int], prompt: list[int], block: int) -> tuple[str, int]:
    """The outcome and the tokens P must pull for `prompt` when D holds `held`."""
    if len(prompt) > len(held) and prompt[: len(held)] == held:
        return "hit", len(held)
    common = 0
    for a, b in zip(held, prompt, strict=False):
        if a != b:
            break
        common += 1
    reusable = min(common, len(prompt) - 1) // block * block
    return ("partial", reusable) if reusable >= THRESHOLD else ("rejected", 0)


def pulled_and_outcome(plane, router: str, send) -> tuple[Any, float, dict[str, float]]:
    p_before, r_before = pdclient.external_tokens(pdclient.scrape(plane.p_url)), reuse(router)
    result = send()
    pulled = pdclient.external_tokens(pdclient.scrape(plane.p_url)) - p_before
    return result, pulled, counted(router, r_before)


def completion_turn(plane, router: str, conv: str, prompt: list[int], block: int, held):
    """A token-id turn that must reuse exactly what `expected` says; returns D's new held ids."""
    (tokens, logprobs, _), pulled, outcome = pulled_and_outcome(
        plane, router, lambda: router_completion(router, plane.model, prompt, conv, stream=False)
    )
    if held is not None:
        kind, count = expected(held, prompt, block)
        assert outcome == {kind: 1.0}, (outcome, kind, count)
        assert pulled == count, f"P pulled {pulled} tokens, the common whole blocks hold {count}"
    assert same((tokens, logprobs), reference(plane, prompt))
    return prompt + tokens[:-1], tokens


def test_a_diverging_prompt_pulls_exactly_the_common_whole_blocks(dataplane, router, block):
    rng = random.Random(41)
    first = words(rng, 5 * block + 40)
    held, _ = completion_turn(dataplane, router, "partial-diverge", first, block, None)
    # The client changed the history 2.5 blocks in: the first two blocks are D's to give.
    second = first[: 2 * block + block // 2] + words(rng, 3 * block)
    assert expected(held, second, block) == ("partial", 2 * block)
    completion_turn(dataplane, router, "partial-diverge", second, block, held)


def test_a_divergence_inside_the_first_block_is_rejected(dataplane, router, block):
    rng = random.Random(43)
    first = words(rng, 3 * block)
    held, _ = completion_turn(dataplane, router, "partial-early", first, block, None)
    second = first[:10] + words(rng, 3 * block)
    completion_turn(dataplane, router, "partial-early", second, block, held)


def test_a_regenerated_turn_reuses_the_blocks_of_its_own_prompt(dataplane, router, block):
    rng = random.Random(47)
    first = words(rng, 4 * block + 7)
    held, _ = completion_turn(dataplane, router, "partial-regen", first, block, None)
    # The same prompt again (the client discarded the reply): it is a prefix of D's ids.
    completion_turn(dataplane, router, "partial-regen", first, block, held)


def test_a_reply_that_re_tokenises_differently_reuses_up_to_the_change(dataplane, router, block):
    rng = random.Random(53)
    first = words(rng, 3 * block + 100)
    held, reply = completion_turn(dataplane, router, "partial-retok", first, block, None)
    split = split_one_token(dataplane, reply[:-1])
    assert split is not None, f"no token of {reply} splits into two that decode the same"
    i, pieces = split
    echoed = reply[:i] + pieces + reply[i + 1 :]  # the same text, other ids
    second = first + echoed + words(rng, 60)
    kind, count = expected(held, second, block)
    assert kind == "partial" and count == (len(first) + i) // block * block
    completion_turn(dataplane, router, "partial-retok", second, block, held)


def split_one_token(plane, ids: list[int]) -> tuple[int, list[int]] | None:
    """A position and two ids whose text is that token's text (as a client's tokenizer may
    produce when it re-encodes the reply it was sent)."""
    for i, token in enumerate(ids):
        text = detokenize(plane, [token])
        if len(text) < 2:
            continue
        pieces = tokenize(plane, text[:1]) + tokenize(plane, text[1:])
        if pieces != [token] and detokenize(plane, pieces) == text:
            return i, pieces
    return None


def tokenize(plane, text: str) -> list[int]:
    body = {"model": plane.model, "prompt": text, "add_special_tokens": False}
    return list(pdclient.post(f"{plane.p_url}/tokenize", body)["tokens"])


def detokenize(plane, ids: list[int]) -> str:
    body = {"model": plane.model, "tokens": ids}
    return str(pdclient.post(f"{plane.p_url}/detokenize", body)["prompt"])


def chat_turn(plane, router: str, conv: str, messages, **extra) -> tuple[str, list[int], Any]:
    """One chat turn through the router with ids on; returns reply, D's held ids, outcome."""
    body = chat_body(plane.model, messages, return_token_ids=True, conversation_id=conv, **extra)
    resp, pulled, outcome = pulled_and_outcome(
        plane, router, lambda: pdclient.post(f"{router}/v1/chat/completions", body)
    )
    choice = resp["choices"][0]
    text = choice["message"]["content"]
    lps = [c["logprob"] for c in choice["logprobs"]["content"]]
    assert same((text, lps), chat_reference(plane, messages, **extra))
    return text, resp["prompt_token_ids"] + choice["token_ids"][:-1], (pulled, outcome)


def chat_prompt_ids(plane, messages, **extra) -> list[int]:
    body = {"model": plane.model, "messages": messages, **extra}
    return list(pdclient.post(f"{plane.p_url}/tokenize", body)["tokens"])


def assert_reused(plane, held, messages, seen, block) -> None:
    pulled, outcome = seen
    kind, count = expected(held, chat_prompt_ids(plane, messages), block)
    assert outcome == {kind: 1.0}, (outcome, kind, count)
    assert pulled == count, f"P pulled {pulled} tokens, the common whole blocks hold {count}"


def test_a_thinking_models_dropped_reasoning_still_reuses_the_history(dataplane, router, block):
    """Turn 1 ends inside the assistant's reasoning (the client prefilled it); turn 2 sends the
    whole reply back, and the template drops the reasoning, as Qwen3's does. The history up to
    the reply is reused; turn 3 then extends what D holds and is a full hit."""
    think = "<think>" + "Let me weigh every option first. " * 12 + "</think>\n"
    messages: list[dict[str, str]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Which route should the boomerang take? " * 8},
        {"role": "assistant", "content": think},
    ]
    prefilled = {"continue_final_message": True, "add_generation_prompt": False}
    answer, held, _ = chat_turn(dataplane, router, "partial-think", messages, **prefilled)
    messages[-1] = {"role": "assistant", "content": think + answer}
    messages.append({"role": "user", "content": "And on the way back? " * 8})
    reply, held2, seen = chat_turn(dataplane, router, "partial-think", messages)
    assert_reused(dataplane, held, messages, seen, block)
    assert expected(held, chat_prompt_ids(dataplane, messages), block)[0] == "partial"
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
    _, _, seen = chat_turn(dataplane, router, "partial-think", messages)
    assert_reused(dataplane, held2, messages, seen, block)


def test_an_edited_last_user_message_reuses_the_unchanged_start(dataplane, router, block):
    question = "Describe the flight of a boomerang in detail. " * 20
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    _, held, _ = chat_turn(dataplane, router, "partial-edit", messages)
    edited = [messages[0], {"role": "user", "content": question[: len(question) // 2] + "No."}]
    _, _, seen = chat_turn(dataplane, router, "partial-edit", edited)
    assert_reused(dataplane, held, edited, seen, block)
    assert expected(held, chat_prompt_ids(dataplane, edited), block)[0] == "partial"
