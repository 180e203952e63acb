"""Schema checks on client requests: bad input gets a 400 that says what is wrong.

Why the router checks at all (the engine validates too): the router reads fields itself
(messages, prompt, stream, n, conversation ids) to fingerprint and verify conversations, so it
must never trip over a malformed body, and it must strip fields that are the router's or the
engine's business (`kv_transfer_params` from clients is never trusted). The checks are
deliberately shallow for fields the router only forwards: the engine owns their semantics.
Everything here is pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from boomerang.router.apis.hints import Retention
from boomerang.router.apis.sessions import Session
from boomerang.router.errors import ApiError, bad_request

Kind = Literal["chat", "completion", "responses", "messages"]

ROUTER_FIELDS = ("conversation_id", "prompt_cache_retention")
"""Body fields the router consumes and never forwards (a retention hint is the router's to
apply: `hints.py`)."""
INTERNAL_FIELDS = ("kv_transfer_params", "ec_transfer_params")
"""Engine-internal fields: stripped from client requests and from client responses."""
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_CONVERSATION_ID = 256
_INT_RANGE = (-(2**63), 2**64 - 1)
"""What orjson keeps exact (and can write back): outside it, it reads an integer as a float."""
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 19
"""Any number that can leave `_INT_RANGE` has a run of at least 19 digits. Mapping every digit
to 0 and searching for 19 zeros is a few times faster than a regex on token-id prompts."""


@dataclass(frozen=True)
class ClientRequest:
    """A validated request: the body to forward and what the router needs to know about it."""

    kind: Kind
    body: dict[str, Any]
    stream: bool
    conversation_id: str | None
    wants_token_ids: bool
    include_usage: bool
    model: str | None
    session: Session | None = None
    """The agent's session naming the conversation when no `conversation_id` does
    (`sessions.py`)."""
    retention: Retention | None = None
    """The client's retention hint, as asked and as capped (`hints.py`)."""

    @property
    def single_choice(self) -> bool:
        """Reuse is only tracked for one choice (D's params describe one sequence)."""
        n = self.body.get("n")
        return n in (None, 1) and self.body.get("best_of") in (None, 1)


def parse_json(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body or raise a 400.

    orjson silently turns an integer beyond 64 bits into a float, so a client's `seed` of
    2**70 would reach the engine as a different number. Such a body is read again with the
    exact stdlib parser (only when a run of 19 digits appears: rare, and cheap to look for) and
    an out-of-range integer is refused, naming where it is.
    """
    try:
        data = orjson.loads(raw)
        if _LONG_DIGITS in raw.translate(_DIGITS_AS_ZERO):
            data = json.loads(raw)
            _check_int_range(data, "")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    return data


def _check_int_range(value: Any, where: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            name = where or "body"
            raise bad_request(f"`{name}` is an integer outside the 64-bit range", name)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_int_range(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_int_range(item, f"{where}[{i}]")


CACHE_SALT_MAX = 128
_SALT_FORBIDDEN = frozenset("@/\\\0")


def _check_cache_salt(value: Any) -> None:
    """vLLM's own rule for `cache_salt` (a non-empty string of at most 128 characters, none
    of `@`, `/`, `\\`, NUL), checked here because the router sends the engines a digest of it
    (`cache_salt.py`), which vLLM would never refuse."""
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise bad_request("`cache_salt` must be a non-empty string", "cache_salt")
    if len(value) > CACHE_SALT_MAX or any(c in _SALT_FORBIDDEN for c in value):
        raise bad_request(
            "`cache_salt` must be at most 128 characters and must not contain '@', '/', "
            "'\\\\' or NUL",
            "cache_salt",
        )


def client_body(data: dict[str, Any]) -> dict[str, Any]:
    """The body an engine may get of a client's: without the router's fields and the
    engine-internal ones, wherever a client can put them. vLLM also reads `kv_transfer_params`
    from `vllm_xargs` (its sampling params' extra args) when the top-level field is absent, as
    on one engine alone: a client's params there would reach the engine's connector."""
    body = {k: v for k, v in data.items() if k not in ROUTER_FIELDS and k not in INTERNAL_FIELDS}
    _check_cache_salt(body.get("cache_salt"))
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, dict) and any(k in xargs for k in INTERNAL_FIELDS):
        body["vllm_xargs"] = {k: v for k, v in xargs.items() if k not in INTERNAL_FIELDS}
    return body


def validate(kind: Kind, data: dict[str, Any], header_conversation_id: str | None) -> ClientRequest:
    """Check the fields the router reads; return the cleaned request. Raises ApiError(400)."""
    body = client_body(data)
    model = optional(data, "model", str)
    if kind == "chat":
        _check_messages(data.get("messages"))
    else:
        _check_prompt(data.get("prompt"))
    stream = optional(data, "stream", bool) or False
    for name in ("max_tokens", "max_completion_tokens", "n", "best_of", "min_tokens"):
        value = optional(data, name, int)
        if value is not None and value < (1 if name in ("n", "best_of") else 0):
            raise bad_request(f"`{name}` must be a non-negative integer", name)
    stream_options = optional(data, "stream_options", dict)
    if stream_options is not None and not stream:
        raise bad_request(
            "`stream_options` is only allowed when `stream` is true", "stream_options"
        )
    include_usage = bool(stream_options and stream_options.get("include_usage") is True)
    wants_ids = optional(data, "return_token_ids", bool) or False
    conv = conversation_id(data.get("conversation_id"), header_conversation_id)
    return ClientRequest(kind, body, stream, conv, wants_ids, include_usage, model)


def optional(data: dict[str, Any], name: str, type_: type) -> Any:
    """`data[name]` when it is of `type_` (None when absent or null); else a 400 naming it."""
    value = data.get(name)
    if value is None:
        return None
    ok = isinstance(value, type_) and not (type_ is int and isinstance(value, bool))
    if not ok:
        raise bad_request(f"`{name}` must be of type {type_.__name__}", name)
    return value


def conversation_id(body_value: Any, header_value: str | None) -> str | None:
    """The client's conversation id (body field, else header), checked."""
    value = body_value if body_value is not None else header_value
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value or len(value) > MAX_CONVERSATION_ID:
        raise bad_request(
            f"`conversation_id` must be a non-empty string of at most {MAX_CONVERSATION_ID} "
            "characters",
            "conversation_id",
        )
    return value


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array", "messages")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"`{where}` must be an object", where)
        role = msg.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise bad_request(f"`{where}.role` must be one of {sorted(_ROLES)}", f"{where}.role")
        content = msg.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(f"`{where}.content` must be a string or an array", where)
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise bad_request(f"`{where}.content` parts must be objects", f"{where}.content")
        tool_calls = msg.get("tool_calls")
        if tool_calls is not None and not (
            isinstance(tool_calls, list) and all(isinstance(t, dict) for t in tool_calls)
        ):
            raise bad_request(f"`{where}.tool_calls` must be an array of objects", where)


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            return
        if all(isinstance(p, str) for p in prompt):
            return
        if all(isinstance(p, list) for p in prompt):
            return
    raise bad_request(
        "`prompt` must be a string, an array of strings, or an array of token ids", "prompt"
    )


def check_model(requested: str | None, served: str | None) -> None:
    """A request for a model this router does not serve is a 404, like OpenAI's."""
    if served is not None and requested is not None and requested != served:
        raise ApiError(
            404,
            f"The model `{requested}` does not exist; this router serves `{served}`.",
            param="model",
            code="model_not_found",
        )
