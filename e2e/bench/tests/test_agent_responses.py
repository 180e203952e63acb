"""The agent workload as Responses requests: the same plan, turned into an agent's items."""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from test_agent_workload import METRICS

from bench.agents import responses as ar
from bench.agents import run as bench_agents
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


class FakeRouter(BaseHTTPRequestHandler):
    """A router answering each Responses request with one output message, streamed as named
    events; it keeps what it was sent (request id, conversation id, input)."""

    seen: dict[str, tuple[str, list[Any]]] = {}

    def log_message(self, *_args: object) -> None:
        pass

    def do_GET(self) -> None:  # D's /metrics for the sampler: nothing in use
        self.reply(METRICS.replace("} 0.25", "} 0.0").encode(), "text/plain")

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

    def reply(self, data: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_responses_replay_sends_the_whole_conversation_with_each_answer_echoed() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRouter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    plan = aw.make_plan(dataclasses.replace(aw.QUICK, conversations=2))
    ctx = {"router": url, "p": url, "d": url, "model": "m", "timeout": 10.0, "label": "t"}
    ctx |= {"ttl_s": 30.0, "api": "responses"}
    try:
        run = bench_agents.replay(ctx, plan, 0.0, bench_agents.KvSampler(url, 0.05))
    finally:
        server.shutdown()
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
