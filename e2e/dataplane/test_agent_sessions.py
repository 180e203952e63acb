"""Agents that say who they are and how long to keep their cache, through the real stack: the
official `openai` and `anthropic` clients through the router on the vLLM CPU P/D pair (issue 35).

- Sessions: an agent loop identified only by a session header, whose client rewrites the
  whitespace of its last assistant message before sending it back (no fingerprint of the
  history can match), still finds its handle every turn: each follow-up is a verified hit or
  partial, never a miss; `prompt_cache_key` names a conversation the same way.
- Retention hints: `prompt_cache_retention` and Anthropic's `cache_control` with both TTLs
  are taken (counted by the router, the ones above the cap capped), never refused.
- Usage: what the SDKs read back is the engines' own count of the prompt tokens the turn did
  not compute: at least what P pulled from D (P's `prompt_tokens_by_source
  {source="external_kv_transfer"}`), never more than the prompt.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from dataplane.turns import counted, reuse

from boomerang.local import pdclient
from boomerang.local.engine_client import samples

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

MAX_TOKENS = 8
GREEDY = {"temperature": 0.0}
FOLLOW_UPS = ({"hit": 1.0}, {"partial": 1.0})


@pytest.fixture(scope="module")
def router(dataplane) -> str:
    return dataplane.router("router-agent-sessions")


def external(plane) -> float:
    return pdclient.external_tokens(pdclient.scrape(plane.p_url))


def metric(router: str, name: str) -> float:
    return sum(s.value for s in samples(pdclient.scrape(router), name))


def check_turn(turn: int, outcome: dict[str, float]) -> None:
    if turn == 0:
        assert outcome == {"miss": 1.0}, outcome
    else:
        assert outcome in FOLLOW_UPS, (turn, outcome)


def check_cached(turn: int, cached: int | None, prompt: int, pulled: float) -> None:
    """The engines' count: present, within the prompt, and on a follow-up at least what P
    pulled from D (P's count is its prefix-cache hit plus what it pulled)."""
    assert cached is not None and 0 <= cached <= prompt, (turn, cached, prompt)
    if turn:
        assert cached > 0 and cached >= pulled, (turn, cached, pulled)


def rewrite_whitespace(text: str | None) -> str:
    """What some clients do to an assistant message before sending it back."""
    return "  " + " ".join((text or "").split()) + "\n\n"


def test_a_header_identified_agent_loop_is_found_by_its_session(dataplane, router):
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="test", max_retries=0)
    session = {"x-claude-code-session-id": f"session-{uuid.uuid4().hex}"}
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent. " * 20},
        {"role": "user", "content": "Fix the failing test in the parser module. " * 20},
    ]
    for turn in range(4):
        before, ext = reuse(router), external(dataplane)
        answer = client.chat.completions.create(
            model=dataplane.model,
            messages=messages,
            max_tokens=MAX_TOKENS,
            extra_headers=session,
            **GREEDY,
        )
        check_turn(turn, counted(router, before))
        usage = answer.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens
        check_cached(turn, cached, usage.prompt_tokens, external(dataplane) - ext)
        reply = answer.choices[0].message.content
        messages.append({"role": "assistant", "content": rewrite_whitespace(reply)})
        messages.append({"role": "user", "content": f"The test still fails ({turn}). " * 10})


def test_openai_chat_prompt_cache_key_and_retention(dataplane, router):
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="test", max_retries=0)
    key = f"key-{uuid.uuid4().hex}"
    messages: list[Any] = [{"role": "user", "content": "Summarise the design document. " * 30}]
    hints, capped = (
        metric(router, "boomerang_router_retention_hint_seconds_count"),
        metric(router, "boomerang_router_retention_hints_capped_total"),
    )
    for turn, retention in enumerate(("in_memory", "24h", "in_memory")):
        before, ext = reuse(router), external(dataplane)
        answer = client.chat.completions.create(
            model=dataplane.model,
            messages=messages,
            max_tokens=MAX_TOKENS,
            prompt_cache_key=key,
            prompt_cache_retention=retention,  # type: ignore[arg-type]
            **GREEDY,
        )
        check_turn(turn, counted(router, before))
        usage = answer.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens
        check_cached(turn, cached, usage.prompt_tokens, external(dataplane) - ext)
        messages += [
            {"role": "assistant", "content": rewrite_whitespace(answer.choices[0].message.content)},
            {"role": "user", "content": f"Shorter, please ({turn}). " * 10},
        ]
    assert metric(router, "boomerang_router_retention_hint_seconds_count") == hints + 3
    assert metric(router, "boomerang_router_retention_hints_capped_total") >= capped + 1  # 24h


def test_openai_responses_prompt_cache_key_and_cached_tokens(dataplane, router):
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="test", max_retries=0)
    key = f"responses-{uuid.uuid4().hex}"
    items: list[Any] = [{"role": "user", "content": "Plan the migration step by step. " * 30}]
    for turn in range(3):
        before, ext = reuse(router), external(dataplane)
        body: dict[str, Any] = {
            "model": dataplane.model,
            "input": items,
            "max_output_tokens": MAX_TOKENS,
            "store": False,
            "prompt_cache_key": key,
            "prompt_cache_retention": "24h",
            **GREEDY,
        }
        if turn == 1:
            with client.responses.stream(**body) as stream:
                for _ in stream:
                    pass
                answer = stream.get_final_response()
        else:
            answer = client.responses.create(**body)
        check_turn(turn, counted(router, before))
        usage = answer.usage
        assert usage is not None
        cached = usage.input_tokens_details.cached_tokens
        check_cached(turn, cached, usage.input_tokens, external(dataplane) - ext)
        items += [item.model_dump(exclude_none=True) for item in answer.output]
        items.append({"role": "user", "content": f"Next step {turn}. " * 10})


def test_anthropic_cache_control_with_both_ttls_and_cache_usage(dataplane, router):
    import anthropic

    client = anthropic.Anthropic(base_url=router, api_key="test", max_retries=0)
    session = {"x-claude-code-session-id": f"claude-{uuid.uuid4().hex}"}
    system = [
        {
            "type": "text",
            "text": "You are a careful reviewer. " * 20,
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        }
    ]
    msgs: list[Any] = [{"role": "user", "content": "Review this change. " * 30}]
    capped = metric(router, "boomerang_router_retention_hints_capped_total")
    for turn in range(4):
        last = {"type": "text", "text": f"Turn {turn}: what else? " * 5}
        last["cache_control"] = {"type": "ephemeral", "ttl": "5m"}
        if turn:
            msgs.append({"role": "user", "content": [last]})
        before, ext = reuse(router), external(dataplane)
        body: dict[str, Any] = {
            "model": dataplane.model,
            "system": system,
            "messages": msgs,
            "max_tokens": MAX_TOKENS,
            "extra_headers": session,
            "extra_body": GREEDY,
        }
        if turn % 2:
            with client.messages.stream(**body) as stream:
                answer = stream.get_final_message()
        else:
            answer = client.messages.create(**body)
        check_turn(turn, counted(router, before))
        usage = answer.usage
        read, created = usage.cache_read_input_tokens, usage.cache_creation_input_tokens
        assert read is not None and created is not None, usage
        prompt = usage.input_tokens + read + created  # Anthropic's accounting: they add up
        check_cached(turn, read, prompt, external(dataplane) - ext)
        assert created >= 0 and usage.input_tokens >= 0
        content = [block.model_dump(exclude_none=True) for block in answer.content]
        text = "".join(b.get("text") or "" for b in content)
        msgs.append({"role": "assistant", "content": rewrite_whitespace(text)})
    # The 1h TTL is above the decoder TTL the local manifest runs with: capped, never refused.
    assert metric(router, "boomerang_router_retention_hints_capped_total") >= capped + 4


def test_a_cache_control_of_the_wrong_shape_is_anthropic_s_400(dataplane, router):
    import anthropic

    client = anthropic.Anthropic(base_url=router, api_key="test", max_retries=0)
    block = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": 60}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model=dataplane.model,
            max_tokens=4,
            messages=[{"role": "user", "content": [block]}],  # type: ignore[list-item]
        )
    assert "cache_control.ttl" in str(refused.value)


def test_sub_agents_under_their_parent_s_session_keep_their_own_kv(dataplane, router):
    """Claude Code's Task agents carry the parent's `x-claude-code-session-id`: two sub-agents
    under one session, their turns interleaved through the official SDK, each find their own
    handle on every follow-up (a verified hit or partial), never the sibling's."""
    import anthropic

    client = anthropic.Anthropic(base_url=router, api_key="test", max_retries=0)
    session = {"x-claude-code-session-id": f"parent-{uuid.uuid4().hex}"}
    system = "You are a sub-agent of a coding agent. " * 20
    agents: list[list[Any]] = [
        [{"role": "user", "content": f"{task} " * 30}]
        for task in ("Find where the parser fails.", "Write a regression test for it.")
    ]
    for turn in range(3):
        for msgs in agents:
            before = reuse(router)
            answer = client.messages.create(
                model=dataplane.model, system=system, messages=msgs, max_tokens=MAX_TOKENS,
                extra_headers=session, extra_body=GREEDY,
            )  # fmt: skip
            check_turn(turn, counted(router, before))
            content = [block.model_dump(exclude_none=True) for block in answer.content]
            msgs += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": f"Tool result {turn}: ok. " * 8},
            ]
