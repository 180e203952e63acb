"""The agent workload as Responses requests: the same plan, turned into an agent's items."""

from __future__ import annotations

import json
from typing import Any

from test_agent_workload import FakeEngines, replayed

from bench.agents import responses as ar
from bench.agents import workload as aw


def planned(kind: str, index: int = 2, new_tokens: int = 40) -> aw.PlannedTurn:
    return aw.PlannedTurn(index, kind, new_tokens, 0.0, 8, 1234 + index)


def test_user_turns_are_user_messages_of_about_the_planned_size() -> None:
    for kind in ("first", "user"):
        (item,) = ar.turn_items(planned(kind, new_tokens=40))
        assert item["role"] == "user"
        assert len(item["content"].split()) == 40


def test_tool_turns_are_a_written_call_and_its_output() -> None:
    call, output = ar.turn_items(planned("tool_medium", index=3, new_tokens=300))
    assert call["type"] == "function_call" and call["name"] == ar.TOOL["name"]
    assert output == {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": ar.text_of(planned("tool_medium", index=3, new_tokens=300)),
    }
    assert len(output["output"].split()) == 300


def test_texts_are_the_same_every_time_and_differ_by_turn() -> None:
    assert ar.text_of(planned("user")) == ar.text_of(planned("user"))
    assert ar.text_of(planned("user", index=2)) != ar.text_of(planned("user", index=3))


def test_every_request_is_stateless_greedy_and_exactly_as_long_as_planned() -> None:
    body = ar.request_body("m", [{"role": "user", "content": "x"}], 17)
    assert body["store"] is False and body["stream"] is True
    assert body["max_output_tokens"] == 17 and body["ignore_eos"] is True
    assert body["temperature"] == 0.0 and body["tools"] == [ar.TOOL]


class FakeRouter(FakeEngines):
    """A router answering each Responses request with one output message, streamed as named
    events; it keeps what it was sent (request id, conversation id, input)."""

    seen: dict[str, tuple[str, list[Any]]] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rid = self.headers["X-Request-Id"]
        self.seen[rid] = (self.headers["X-Conversation-Id"], body["input"])
        text = {"type": "output_text", "text": f"answer to {rid}"}
        item = {"type": "message", "role": "assistant", "content": [text]}
        response = {"status": "incomplete", "output": [item], "usage": {"input_tokens": 7}}
        events = [
            ("response.output_text.delta", {"delta": "a"}),
            ("response.incomplete", {"response": response}),
        ]
        raw = "".join(f"event: {n}\ndata: {json.dumps({'type': n, **d})}\n\n" for n, d in events)
        self.reply(raw.encode(), "text/event-stream")


def test_a_responses_replay_sends_the_whole_conversation_with_each_answer_echoed() -> None:
    plan, run = replayed(FakeRouter, api="responses")
    for conv in plan.conversations:
        expected: list[Any] = []
        for turn in conv.turns:
            rid = f"t-{conv.id}-t{turn.index}"
            expected = expected + ar.turn_items(turn)
            assert FakeRouter.seen[rid] == (f"t-{conv.id}", expected)
            answer = {"type": "output_text", "text": f"answer to {rid}"}
            expected = [*expected, {"type": "message", "role": "assistant", "content": [answer]}]
    assert len(run["records"]) == len(list(plan.turns()))
    assert all(r["ttft_s"] is not None and r["prompt_tokens"] == 7 for r in run["records"])
