"""The agent workload through the Responses API (`bench_agents.py --api responses`).

The plan is the same (`workload`): conversations, turns, think times, suffix sizes and
output lengths. What changes is what a turn sends: an agent's Responses `input`, the whole
conversation every turn (stateless, `store: false`), with the conversation named in the
`X-Conversation-Id` header. Turn 1 is the task as a user message; a "user" suffix is a user
message; a tool suffix is what an agent appends after the model's answer: the tool call (the
tiny model cannot choose tools, so the client writes it) and the tool's output, whose text is
the suffix. The model's output items are echoed back as they came. Texts are words of the
builtin models' training corpus, drawn from the turn's own seed, about one word per planned
token (the prompt sizes are what the engines report, `usage.input_tokens`).

`turn_items` and `request_body` are pure; `streamed_turn` is the one request.
"""

from __future__ import annotations

import json
import time
from typing import Any

from boomerang.connector.launch.model import corpus
from boomerang.local import pdclient

from bench.agents import workload as aw

TOOL = {
    "type": "function",
    "name": "run_tool",
    "description": "Runs a tool of the agent's and returns its output.",
    "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
}
INSTRUCTIONS = "You are an agent. Call tools when you need them, then answer."


def text_of(turn: aw.PlannedTurn) -> str:
    """About `new_tokens` words of the builtin models' corpus, from the turn's own seed."""
    words: list[str] = []
    lines = corpus(seed=turn.token_seed, lines=max(1, turn.new_tokens // 8 + 1))
    for line in lines:
        words += line.split()
        if len(words) >= turn.new_tokens:
            break
    return " ".join(words[: max(1, turn.new_tokens)])


def turn_items(turn: aw.PlannedTurn) -> list[dict[str, Any]]:
    """The input items a turn appends after the model's previous output."""
    text = text_of(turn)
    if turn.kind in ("first", "user"):
        return [{"role": "user", "content": text}]
    call_id = f"call_{turn.index}"
    arguments = json.dumps({"step": turn.index})
    call = {"type": "function_call", "call_id": call_id, "name": TOOL["name"]}
    output = {"type": "function_call_output", "call_id": call_id, "output": text}
    return [{**call, "arguments": arguments}, output]


def request_body(model: str, items: list[Any], max_tokens: int) -> dict[str, Any]:
    """A streamed, greedy Responses request generating exactly `max_tokens` tokens."""
    return {
        "model": model,
        "instructions": INSTRUCTIONS,
        "input": items,
        "tools": [TOOL],
        "max_output_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "store": False,
        "stream": True,
    }


def streamed_turn(
    ctx: dict[str, Any], items: list[Any], conv: str, rid: str, max_tokens: int
) -> tuple[float, list[Any], int]:
    """One turn through the router: TTFT (POST to the first output delta), the output items
    to echo, and the prompt's size in tokens."""
    body = request_body(ctx["model"], items, max_tokens)
    headers = {"X-Request-Id": rid, "X-Conversation-Id": conv}
    start = time.perf_counter()
    ttft: float | None = None
    final: dict[str, Any] | None = None
    url = f"{ctx['router']}/v1/responses"
    for arrived, event in pdclient.stream_events(url, body, ctx["timeout"], headers):
        kind = event.get("type", "")
        if ttft is None and kind.endswith(".delta"):
            ttft = arrived - start
        if kind in ("response.completed", "response.incomplete"):
            final = event["response"]
    if ttft is None or final is None:
        raise RuntimeError("no output streamed")
    return ttft, list(final["output"]), int(final["usage"]["input_tokens"])
