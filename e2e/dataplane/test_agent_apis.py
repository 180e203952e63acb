"""Agents' own APIs through the real stack: the official `openai` client's `responses.create` and
the official `anthropic` client's `messages.create`, through the router, on the vLLM CPU P/D
pair (with the local manifest's tool-call and reasoning parsers and its chat template).

An agent loop of several turns, streamed and not: the tiny model cannot choose tools, so the
client writes the assistant's tool call into the history after each answer and the tool's
result is the next turn's new input. What must hold on every turn: a follow-up is a verified
hit or partial reuse (the router's counters), P pulls history back from D (its
`prompt_tokens_by_source{source="external_kv_transfer"}`), and the answer equals a single
engine's on the same API and request (P alone, no transfer, no prefix cache; greedy, float32):
the same text and, for Responses, the same logprobs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from dataplane.turns import LOGPROB_TOL, counted, reuse

from boomerang.local import pdclient
from boomerang.local.engine_client import samples

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

MAX_TOKENS = 8
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
A_WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
GREEDY = {"temperature": 0.0}
FOLLOW_UPS = ({"hit": 1.0}, {"partial": 1.0})


@pytest.fixture(scope="module")
def router(dataplane) -> str:
    return dataplane.router("router-agent-apis")


def external(plane) -> float:
    return pdclient.external_tokens(pdclient.scrape(plane.p_url))


def mismatches(router: str) -> float:
    """Turns whose P rendered other ids than verification did (the safety net's count)."""
    name = "boomerang_router_verification_prompt_mismatch_total"
    return sum(s.value for s in samples(pdclient.scrape(router), name))


def check_turn(turn: int, outcome: dict[str, float], pulled: float) -> None:
    if turn == 0:
        assert outcome == {"miss": 1.0}, outcome
    else:
        assert outcome in FOLLOW_UPS, (turn, outcome)
        assert pulled > 0, (turn, pulled)


# -- Responses ---------------------------------------------------------------------------------


def responses_reference(plane, body: dict[str, Any]) -> tuple[str, list[float]]:
    """The same request on P alone (no transfer params: P computes it all and decodes)."""
    answer = pdclient.post(f"{plane.p_url}/v1/responses", body)
    return output_text(answer["output"]), output_logprobs(answer["output"])


def output_text(output: list[Any]) -> str:
    parts = []
    for item in output:
        if item["type"] == "message":
            parts += [c["text"] for c in item["content"] if c["type"] == "output_text"]
        elif item["type"] == "reasoning":
            parts += [c["text"] for c in item.get("content") or []]
    return "".join(parts)


def output_logprobs(output: list[Any]) -> list[float]:
    return [
        lp["logprob"]
        for item in output
        if item["type"] == "message"
        for c in item["content"]
        for lp in c.get("logprobs") or []
    ]


def test_responses_agent_loop_reuses_every_turn_and_matches_one_engine(dataplane, router):
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="test", max_retries=0)
    items: list[Any] = [{"role": "user", "content": "What is the weather like? " * 40}]
    for turn in range(4):
        body: dict[str, Any] = {
            "model": dataplane.model,
            "input": items,
            "instructions": "You are a weather agent. " * 20,
            "tools": [WEATHER],
            "max_output_tokens": MAX_TOKENS,
            "include": ["message.output_text.logprobs"],
            "store": False,
            **GREEDY,
        }
        before, ext = reuse(router), external(dataplane)
        extra = {"extra_headers": {"X-Conversation-Id": "weather-agent"}}
        if turn % 2:
            with client.responses.stream(**body, **extra) as stream:
                for _ in stream:
                    pass
                answer = stream.get_final_response()
        else:
            answer = client.responses.create(**body, **extra)
        output = [item.model_dump(exclude_none=True) for item in answer.output]
        check_turn(turn, counted(router, before), external(dataplane) - ext)
        text, logprobs = output_text(output), output_logprobs(output)
        ref_text, ref_logprobs = responses_reference(dataplane, body)
        assert text == ref_text, turn
        assert logprobs == pytest.approx(ref_logprobs, abs=LOGPROB_TOL)
        assert not {"kv_transfer_params", "prompt_token_ids", "token_ids"} & set(answer.to_dict())
        call = {"type": "function_call", "call_id": f"call_{turn}", "name": "get_weather"}
        items += [*output, {**call, "arguments": json.dumps({"city": f"Paris {turn}"})}]
        result = {"temperature_c": 20 + turn, "sky": "clear " * 30}
        items.append(
            {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": json.dumps(result),
            }
        )
    assert mismatches(router) == 0


def test_responses_without_a_conversation_id_are_found_by_their_history(dataplane, router):
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="test", max_retries=0)
    items: list[Any] = [{"role": "user", "content": "Tell me a story. " * 40}]
    for turn in range(3):
        before = reuse(router)
        answer = client.responses.create(
            model=dataplane.model, input=items, max_output_tokens=MAX_TOKENS, store=False, **GREEDY
        )
        check_turn(turn, counted(router, before), 1.0)
        items += [item.model_dump(exclude_none=True) for item in answer.output]
        items.append({"role": "user", "content": f"And then {turn}? " * 20})


def test_reasoning_the_template_drops_reuses_the_blocks_before_it(dataplane, router):
    # With a reasoning effort the qwen3 parser returns the answer as a reasoning item; the
    # template leaves an earlier turn's reasoning out of the next prompt (as Qwen3's does),
    # so D's tokens are not all in it: the blocks before the reasoning are reused, verified.
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="test", max_retries=0)
    items: list[Any] = [{"role": "user", "content": "Think about the weather. " * 60}]
    for turn in range(3):
        body: dict[str, Any] = {
            "model": dataplane.model,
            "input": items,
            "reasoning": {"effort": "low"},
            "max_output_tokens": MAX_TOKENS,
            "store": False,
            **GREEDY,
        }
        before, ext = reuse(router), external(dataplane)
        answer = client.responses.create(**body, extra_headers={"X-Conversation-Id": "think"})
        output = [item.model_dump(exclude_none=True) for item in answer.output]
        outcome = counted(router, before)
        check_turn(turn, outcome, external(dataplane) - ext)
        assert [item["type"] for item in output] == ["reasoning"]
        assert turn == 0 or outcome == {"partial": 1.0}
        assert output_text(output) == responses_reference(dataplane, body)[0]
        items += [*output, {"role": "user", "content": f"More about {turn}. " * 20}]


def test_server_side_state_is_refused_naming_the_field(dataplane, router):
    import openai

    client = openai.OpenAI(base_url=f"{router}/v1", api_key="test", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=dataplane.model, input="hi", previous_response_id="resp_1")
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=dataplane.model, input="hi", store=True)
    assert refused.value.body["param"] == "store"  # type: ignore[index]


# -- Anthropic Messages ------------------------------------------------------------------------


def messages_reference(plane, body: dict[str, Any]) -> str:
    answer = pdclient.post(f"{plane.p_url}/v1/messages", body)
    return blocks_text(answer["content"])


def blocks_text(content: list[Any]) -> str:
    return "".join(b.get("text") or b.get("thinking") or "" for b in content)


def test_messages_agent_loop_reuses_every_turn_and_matches_one_engine(dataplane, router):
    import anthropic

    client = anthropic.Anthropic(base_url=router, api_key="test", max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "What is the weather like? " * 40}]
    for turn in range(4):
        body: dict[str, Any] = {
            "model": dataplane.model,
            "system": "You are a weather agent. " * 20,
            "messages": msgs,
            "tools": [A_WEATHER],
            "max_tokens": MAX_TOKENS,
        }
        extra = {"extra_body": {**GREEDY, "conversation_id": "weather-agent-messages"}}
        before, ext = reuse(router), external(dataplane)
        if turn % 2:
            with client.messages.stream(**body, **extra) as stream:
                answer = stream.get_final_message()
        else:
            answer = client.messages.create(**body, **extra)
        check_turn(turn, counted(router, before), external(dataplane) - ext)
        content = [block.model_dump(exclude_none=True) for block in answer.content]
        assert blocks_text(content) == messages_reference(dataplane, {**body, **GREEDY}), turn
        use = {"type": "tool_use", "id": f"toolu_{turn}", "name": "get_weather"}
        msgs.append({"role": "assistant", "content": [*content, {**use, "input": {"turn": turn}}]})
        result = json.dumps({"temperature_c": 20 + turn, "sky": "clear " * 30})
        msgs.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": result}],
            }
        )
    assert mismatches(router) == 0


def test_messages_refusals_reach_the_client_as_anthropic_errors(dataplane, router):
    import anthropic

    client = anthropic.Anthropic(base_url=router, api_key="test", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=dataplane.model, max_tokens=4, messages=msgs, container="c")
    assert "container" in str(refused.value)
