"""The fake engines' Responses and Messages endpoints, as vLLM 0.32 with Boomerang's plugin
serves them (`/v1/responses`, `/v1/messages`, their `/render`, `/v1/messages/count_tokens`).

Each request is turned into the chat the fake template renders (instructions or system, then
the messages; tool calls and tool results as the fake template writes them), and served by the
engine's own P and D logic (`FakeEngine.prefill`, `FakeEngine.generate`), so the fabric checks
every transfer as for chat. What the answers carry is vLLM's: D's params in the JSON answer and,
streamed, in the Responses `response.completed` event; with the plugin (`EngineSpec.api_ids`)
the prompt's and output's ids on requests that carry `kv_transfer_params`, and for Messages the
params on the streamed `message_delta`. Streams use the APIs' named events.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from fake_responses import dumps_lenient, json_reply, loaded, loads_lenient
from fake_tokenizer import render_chat


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content or ""


def responses_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses request's input as the chat the fake template renders."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items or ():
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {"function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": _text(item.get("output"))})
    return messages


def messages_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Messages request as the chat the fake template renders."""
    chat: list[dict[str, Any]] = []
    if body.get("system"):
        chat.append({"role": "system", "content": _text(body["system"])})
    for msg in body.get("messages") or ():
        content = msg.get("content")
        if isinstance(content, str):
            chat.append({"role": msg.get("role"), "content": content})
            continue
        texts, calls = [], []
        for block in content or ():
            if block.get("type") == "text":
                texts.append(block.get("text", ""))
            elif block.get("type") == "tool_use":
                args = json.dumps(block.get("input"))
                calls.append({"function": {"name": block.get("name"), "arguments": args}})
            elif block.get("type") == "tool_result":
                chat.append({"role": "tool", "content": _text(block.get("content"))})
        if texts or calls:
            entry: dict[str, Any] = {"role": msg.get("role"), "content": "".join(texts)}
            if calls:
                entry["tool_calls"] = calls
            chat.append(entry)
    return chat


def _chat_body(api: str, body: dict[str, Any]) -> dict[str, Any]:
    limit = body.get("max_output_tokens") if api == "responses" else body.get("max_tokens")
    convert = responses_chat if api == "responses" else messages_chat
    return {"messages": convert(body), "max_tokens": limit, "stream": body.get("stream")}


def add_routes(app: web.Application, engine: Any) -> None:
    """The Responses and Messages routes of one fake engine."""
    for api in ("responses", "messages"):
        app.router.add_post(f"/v1/{api}", _serve(engine, api))
        app.router.add_post(f"/v1/{api}/render", _render(engine, api))
    app.router.add_post("/v1/messages/count_tokens", _count(engine))


def _render(engine: Any, api: str) -> Any:
    async def handler(request: web.Request) -> web.Response:
        body = loads_lenient(await request.read())
        engine.spec.tokenize_calls += 1
        ids = render_chat(_chat_body(api, body)["messages"])
        return json_reply({"request_id": "r", "token_ids": ids})

    return handler


def _count(engine: Any) -> Any:
    async def handler(request: web.Request) -> web.Response:
        body = loads_lenient(await request.read())
        return json_reply({"input_tokens": len(render_chat(messages_chat(body)))})

    return handler


def _serve(engine: Any, api: str) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        spec = engine.spec
        body = loads_lenient(await request.read())
        if spec.record_calls:
            spec.calls.append(body)
            spec.request_ids.append(request.headers.get("X-Request-Id"))
        if spec.delay_s:
            await asyncio.sleep(spec.delay_s)
        if spec.fail_status is not None:
            return json_reply({"error": {"message": "engine failure"}}, status=spec.fail_status)
        chat = _chat_body(api, body)
        ids = render_chat(chat["messages"])
        params = body.get("kv_transfer_params") or None
        rid = f"{api}-{spec.engine_id}-{next(engine._ids)}"
        with_ids = spec.api_ids and params is not None
        if spec.role == "prefill" and params is not None:
            p_params = engine.prefill(chat, ids, params, rid)
            answer = _Answer(api, rid, body, "x", [ids[-1] % 97], "length", ids, p_params)
            answer.cached = loaded(params, ids)
            return json_reply(answer.json(with_ids))
        content, out, finish, _, d_params = engine.generate(chat, ids, params, rid)
        answer = _Answer(api, rid, body, content, out, finish, ids, d_params)
        answer.cached = loaded(params, ids)
        if not body.get("stream"):
            return json_reply(answer.json(with_ids))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for event in answer.events(with_ids):
                await asyncio.sleep(spec.chunk_delay_s)
                await resp.write(event)
        except (ConnectionResetError, asyncio.CancelledError):
            spec.disconnected += 1
            raise
        await resp.write_eof()
        return resp

    return handler


class _Answer:
    """One generated answer in the API's shapes."""

    def __init__(
        self,
        api: str,
        rid: str,
        body: dict[str, Any],
        content: str,
        out_ids: list[int],
        finish: str,
        prompt_ids: list[int],
        params: dict[str, Any] | None,
    ) -> None:
        self.api, self.rid, self.body, self.content = api, rid, body, content
        self.out_ids, self.finish, self.prompt_ids, self.params = (
            out_ids,
            finish,
            prompt_ids,
            params,
        )
        self.cached = 0
        """Prompt tokens the engine did not compute (`fake_responses.loaded`)."""

    def _extras(self, with_ids: bool) -> dict[str, Any]:
        ids = {"prompt_token_ids": self.prompt_ids, "token_ids": self.out_ids} if with_ids else {}
        return {"kv_transfer_params": self.params, **ids}

    def _response(self, status: str, output: list[Any], usage: Any) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": "response",
            "created_at": 0,
            "model": self.body.get("model") or "fake",
            "status": status,
            "output": output,
            "usage": usage,
            "kv_transfer_params": None,
        }

    def _message_item(self) -> dict[str, Any]:
        text = {"type": "output_text", "text": self.content, "annotations": [], "logprobs": []}
        return {
            "id": f"msg_{self.rid}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [text],
        }

    def _usage(self, with_ids: bool = False) -> dict[str, Any]:
        """vLLM's usage: Responses says what it did not compute; Messages only with the
        plugin (which fills Anthropic's `cache_read_input_tokens`)."""
        p, o = len(self.prompt_ids), len(self.out_ids)
        if self.api == "responses":
            details = {"cached_tokens": self.cached}
            return {
                "input_tokens": p,
                "output_tokens": o,
                "total_tokens": p + o,
                "input_tokens_details": details,
            }
        if not with_ids:
            return {"input_tokens": p, "output_tokens": o}
        # Anthropic's accounting, as vLLM's Messages usage writes it when prompt-token details
        # are on: input_tokens leaves out what was read from the cache.
        return {
            "input_tokens": p - self.cached,
            "output_tokens": o,
            "cache_read_input_tokens": self.cached,
        }

    def json(self, with_ids: bool) -> dict[str, Any]:
        if self.api == "responses":
            status = "completed" if self.finish == "stop" else "incomplete"
            out = self._response(status, [self._message_item()], self._usage(with_ids))
            return {**out, **self._extras(with_ids)}
        return {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "model": self.body.get("model") or "fake",
            "content": [{"type": "text", "text": self.content}],
            "stop_reason": "end_turn" if self.finish == "stop" else "max_tokens",
            "stop_sequence": None,
            "usage": self._usage(with_ids),
            **self._extras(with_ids),
        }

    def events(self, with_ids: bool) -> list[bytes]:
        return (
            self._responses_events(with_ids)
            if self.api == "responses"
            else self._messages(with_ids)
        )

    def _responses_events(self, with_ids: bool) -> list[bytes]:
        item = self._message_item()
        start = self._response("in_progress", [], None)
        part = {"type": "output_text", "text": "", "annotations": []}
        added = {"output_index": 0, "item": {**item, "content": [], "status": "in_progress"}}
        at = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": start}),
            ("response.in_progress", {"response": start}),
            ("response.output_item.added", added),
            ("response.content_part.added", {**at, "part": part}),
        ]
        for word in _words(self.content):
            delta = {**at, "delta": word, "logprobs": []}
            events.append(("response.output_text.delta", delta))
        done = {**at, "text": self.content, "logprobs": []}
        events.append(("response.output_text.done", done))
        events.append(("response.content_part.done", {**at, "part": item["content"][0]}))
        events.append(("response.output_item.done", {"output_index": 0, "item": item}))
        final = self.json(with_ids)
        final["kv_transfer_params"] = self.params  # vLLM 0.32 streams D's params here itself
        name = "response.completed" if final["status"] == "completed" else "response.incomplete"
        events.append((name, {"response": final}))
        return [
            _event(name, {**payload, "type": name, "sequence_number": i})
            for i, (name, payload) in enumerate(events)
        ]

    def _messages(self, with_ids: bool) -> list[bytes]:
        start = {**self.json(False), "content": [], "stop_reason": None}
        for key in ("kv_transfer_params", "prompt_token_ids", "token_ids"):
            start.pop(key, None)
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"message": start}),
            ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ]
        for word in _words(self.content):
            delta = {"type": "text_delta", "text": word}
            events.append(("content_block_delta", {"index": 0, "delta": delta}))
        events.append(("content_block_stop", {"index": 0}))
        stop = "end_turn" if self.finish == "stop" else "max_tokens"
        delta_event: dict[str, Any] = {
            "delta": {"stop_reason": stop},
            "usage": self._usage(with_ids),
        }
        if with_ids:  # the plugin adds them to the last event before message_stop
            delta_event |= self._extras(True)
        events += [("message_delta", delta_event), ("message_stop", {})]
        return [_event(name, {"type": name, **payload}) for name, payload in events]


def _words(content: str) -> list[str]:
    words = content.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dumps_lenient(payload) + b"\n\n"
