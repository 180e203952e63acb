"""The client APIs the router serves, each through the same P/D turn.

`of(kind)` is the `Api` of a request (`base.py` says what one decides); `validate` turns a
client body into the router's `ClientRequest` the API's way. Chat Completions and Completions
(`chat.py`) are vLLM's P/D protocol as written in `protocol.py`; the Responses API
(`responses.py`) and Anthropic's Messages API (`messages.py`) carry the same handles with their
own fields, verification calls, fingerprints, events and errors. What every API shares sits
beside them: parsing a client's body (`validation.py`), its session and cache hints
(`sessions.py`, `hints.py`), the SSE framing (`sse.py`) and usage (`usage.py`). The wing imports
only the router's base modules (config, errors, conversation, ...): every other wing may use it.
"""

from __future__ import annotations

from typing import Any, Final

from boomerang.router.apis import protocol, validation
from boomerang.router.apis.base import Api, DecodeResult, EventStream
from boomerang.router.apis.chat import OpenAICompletions
from boomerang.router.apis.messages import MessagesApi
from boomerang.router.apis.messages import validate as validate_messages
from boomerang.router.apis.responses import ResponsesApi
from boomerang.router.apis.responses import validate as validate_responses
from boomerang.router.apis.validation import ClientRequest, Kind

__all__ = ["APIS", "Api", "DecodeResult", "EventStream", "continue_request", "of", "validate"]

APIS: Final[dict[Kind, Api]] = {
    "chat": OpenAICompletions("chat", "/v1/chat/completions"),
    "completion": OpenAICompletions("completion", "/v1/completions"),
    "responses": ResponsesApi(),
    "messages": MessagesApi(),
}


def of(kind: Kind) -> Api:
    """The API of a request of `kind`."""
    return APIS[kind]


def validate(kind: Kind, data: dict[str, Any], header_conversation_id: str | None) -> ClientRequest:
    """The client's body checked and cleaned the API's way (raises a 400 naming the field)."""
    if kind == "responses":
        return validate_responses(data, header_conversation_id)
    if kind == "messages":
        return validate_messages(data, header_conversation_id)
    return validation.validate(kind, data, header_conversation_id)


def continue_request(api: Api, body: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    """The body for the decoder that holds the history (the continue path): the API's D
    request with empty KV-transfer intent (`protocol.continue_request` for chat)."""
    return api.decode_request(body, dict(protocol.CONTINUE_PARAMS), stream=stream)
