"""What every client API shares in the P/D turn, and what each one must say for itself.

The turn (`flow.py`) is the same for every API: take the conversation's handle, verify it on
the new prompt's token ids, prefill on P with D's params, decode on D, file D's new handle.
What differs per API is pure and lives in one module per API: how its body becomes P's, D's
and the continue and plain requests (where `kv_transfer_params` goes, which field caps the
tokens), how the new prompt's token ids are obtained for verification, how its history is
fingerprinted when the client names no conversation, what the router collects from D's answer
(D's params, D's prompt and output ids, the reply) whether JSON or streamed in the API's own
event format, what the client may see of it, and the API's own error body. `Api` is that
contract; `apis.of(kind)` gives the one for a request.

`DecodeResult` is what D told the router about the sequence it generated, whatever the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from boomerang.router.apis import protocol
from boomerang.router.apis.validation import INTERNAL_FIELDS, ClientRequest, Kind
from boomerang.router.errors import ApiError

if TYPE_CHECKING:
    from aiohttp import web

ADDED_IDS = ("prompt_token_ids", "token_ids")
"""Top-level token-id fields that Boomerang's engine plugin adds to a Responses or Messages
answer (as vLLM's `return_token_ids` does for chat): the router needs them, clients never see
them."""


@dataclass
class DecodeResult:
    """What D told the router about the sequence it generated."""

    params: dict[str, Any] | None = None
    prompt_ids: list[int] | None = None
    output_ids: list[int] = field(default_factory=list)
    reply: Any = None
    """D's answer as the client will echo it in the next turn's history (its shape is the
    API's: a chat message, Responses output items, Messages content blocks)."""
    finished: bool = False
    """D ended the answer itself (a finish reason other than `error`)."""
    finish_reason: str | None = None
    """Why D ended it, as the API says (`stop`, `length`, `end_turn`, `completed`, ...)."""
    response: web.StreamResponse | None = None
    """The response the client got (set by `decode.py`)."""
    carried_over: int = 0
    """Times the stream went on on another engine after its engine died (`migration.py`)."""

    @property
    def held_ids(self) -> list[int] | None:
        """Prompt + output ids, of which D holds the first `remote_num_tokens`."""
        if self.prompt_ids is None:
            return None
        return self.prompt_ids + self.output_ids


class EventStream(Protocol):
    """What the relay asks of an API whose stream names its events (Responses, Messages):
    per event, collect what the next turn needs into `result` and strip what the client may
    not see."""

    result: DecodeResult

    def process(self, name: str, event: dict[str, Any]) -> bool:
        """Collect from one decoded event and strip it in place; whether anything was
        stripped (the relay then re-encodes it, else passes D's bytes on)."""

    def terminal(self, name: str) -> bool:
        """Whether the event named `name` ends the stream (nothing of D's comes after it)."""

    def finish(self) -> None:
        """The stream is over: complete `result.reply` from what the events carried."""

    def error_event(self, message: str, status: int) -> bytes:
        """The API's own in-band error event, for a D that failed mid-stream."""


class Api(Protocol):
    """One client API's part of the turn (see the module docstring)."""

    @property
    def kind(self) -> Kind:
        """The request kind this API serves."""

    @property
    def path(self) -> str:
        """The engine endpoint serving it (P, D, continue and one-engine turns alike)."""

    @property
    def can_buffer(self) -> bool:
        """Whether a streamed answer may be re-emitted from D's JSON when D cannot stream its
        params (chat and completions); otherwise D streams and the turn files no handle."""

    def prefill_request(
        self, body: dict[str, Any], handle: dict[str, Any] | None
    ) -> dict[str, Any]:
        """P's body: one token, not streamed, with D's params when verified."""

    def decode_request(
        self, body: dict[str, Any], p_params: dict[str, Any] | None, *, stream: bool
    ) -> dict[str, Any]:
        """D's body: the client's request plus P's params (or the continue intent)."""

    def plain_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """One engine serving the whole turn as a single engine would (no transfer)."""

    def prompt_ids_request(self, req: ClientRequest) -> tuple[str, dict[str, Any]] | None:
        """(engine path, body) of the call that gives the new prompt's token ids exactly as
        the API's endpoint renders them; None when the request carries them or cannot say."""

    def prompt_ids_from(self, data: dict[str, Any]) -> list[int] | None:
        """The token ids in that call's answer."""

    def known_prompt_ids(self, req: ClientRequest) -> list[int] | None:
        """The prompt's ids when the request itself gives them (token-id prompts)."""

    def lookup_key(self, tenant: str, model: str | None, body: dict[str, Any]) -> bytes | None:
        """The store key a turn without a `conversation_id` finds its conversation by: a
        fingerprint of the history up to the model's last answer; None when there is none."""

    def file_key(
        self, tenant: str, model: str | None, body: dict[str, Any], reply: Any
    ) -> bytes | None:
        """Where the next turn will look: the fingerprint of this turn's input plus D's
        `reply` as the client will send it back; None when it cannot be said."""

    def result_from_response(self, payload: dict[str, Any]) -> DecodeResult:
        """What D's complete (JSON) answer says, before stripping."""

    def client_payload(self, payload: dict[str, Any], *, keep_token_ids: bool) -> dict[str, Any]:
        """A response body as the client may see it (mutates and returns it)."""

    def event_stream(self) -> EventStream | None:
        """The per-event collector of a streamed answer with named events; None: the
        OpenAI chunk relay (`decode.StreamRelay`) handles it."""

    def error_body(self, exc: ApiError) -> dict[str, Any]:
        """The API's own error body for `exc`."""


def strip_added(payload: dict[str, Any]) -> bool:
    """Remove the engine-internal fields and the added token ids from a top-level object;
    whether anything was there."""
    found = False
    for key in (*INTERNAL_FIELDS, *ADDED_IDS):
        if key in payload:
            del payload[key]
            found = True
    return found


def ids_of(value: Any) -> list[int] | None:
    """A list of token ids, or None (a shape check: `conversation.token_hash` checks each id
    where it matters)."""
    if isinstance(value, list) and (not value or isinstance(value[-1], int)):
        return value
    return None


def params_of(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's kv_transfer_params in an object, if it is a usable mapping."""
    params = payload.get("kv_transfer_params")
    return params if isinstance(params, dict) and params else None


def collect_top_level(payload: dict[str, Any], result: DecodeResult) -> None:
    """D's params and the plugin's prompt and output ids on a Responses or Messages object."""
    if (params := params_of(payload)) is not None:
        result.params = params
    if (prompt := ids_of(payload.get("prompt_token_ids"))) is not None:
        result.prompt_ids = prompt
    if (output := ids_of(payload.get("token_ids"))) is not None:
        result.output_ids = output


class RenderedApi:
    """What the APIs whose prompt the engine renders (`<path>/render`: Responses and Messages)
    do alike, written once: the engines' bodies (vLLM's P/D protocol, `protocol.py`, with the
    API's own field bounding P's answer to one token), the render call and the ids in its
    answer, the plain body, and the client's payload without what the router added. Each
    subclass is a frozen dataclass that sets `kind`, `path` and `LIMIT`."""

    path: str
    LIMIT: ClassVar[str]
    """The request field that bounds the answer's length (P's is set to one token)."""

    def prefill_request(
        self, body: dict[str, Any], handle: dict[str, Any] | None
    ) -> dict[str, Any]:
        return protocol.prefill_body(body, handle, limit=self.LIMIT)

    def decode_request(
        self, body: dict[str, Any], p_params: dict[str, Any] | None, *, stream: bool
    ) -> dict[str, Any]:
        return protocol.decode_body(body, p_params, stream=stream)

    def plain_request(self, body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k not in INTERNAL_FIELDS}

    def prompt_ids_request(self, req: ClientRequest) -> tuple[str, dict[str, Any]] | None:
        return f"{self.path}/render", {**req.body, "stream": False}

    def prompt_ids_from(self, data: dict[str, Any]) -> list[int] | None:
        return ids_of(data.get("token_ids"))

    def known_prompt_ids(self, req: ClientRequest) -> list[int] | None:
        return None

    def client_payload(self, payload: dict[str, Any], *, keep_token_ids: bool) -> dict[str, Any]:
        strip_added(payload)
        return payload
