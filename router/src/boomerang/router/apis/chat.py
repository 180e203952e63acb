"""Chat Completions and Completions: the APIs the P/D flow was written for.

Their transforms are `protocol.py` (vLLM's P/D protocol in one screen) and their fingerprint
`conversation.py`; this module only puts them behind the `Api` contract. Both verify on `/tokenize`
(token-id prompts need no call), stream vLLM's unnamed chunks ending with `[DONE]`
(`decode.StreamRelay`), and may be re-emitted from D's JSON when D cannot stream its params.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from boomerang.router import conversation as conv
from boomerang.router.apis import protocol
from boomerang.router.apis.base import DecodeResult, EventStream, ids_of
from boomerang.router.apis.validation import ClientRequest, Kind
from boomerang.router.errors import ApiError


@dataclass(frozen=True)
class OpenAICompletions:
    """`/v1/chat/completions` (kind `chat`) or `/v1/completions` (kind `completion`)."""

    kind: Kind
    path: str
    can_buffer: bool = True

    def prefill_request(
        self, body: dict[str, Any], handle: dict[str, Any] | None
    ) -> dict[str, Any]:
        return protocol.prefill_request(body, handle)

    def decode_request(
        self, body: dict[str, Any], p_params: dict[str, Any] | None, *, stream: bool
    ) -> dict[str, Any]:
        return protocol.decode_request(body, p_params, stream=stream)

    def plain_request(self, body: dict[str, Any]) -> dict[str, Any]:
        return protocol.plain_request(body)

    def prompt_ids_request(self, req: ClientRequest) -> tuple[str, dict[str, Any]] | None:
        body = protocol.tokenize_request(req)
        return None if body is None else ("/tokenize", body)

    def prompt_ids_from(self, data: dict[str, Any]) -> list[int] | None:
        return ids_of(data.get("tokens"))

    def known_prompt_ids(self, req: ClientRequest) -> list[int] | None:
        return protocol.known_prompt_ids(req)

    def lookup_key(self, tenant: str, model: str | None, body: dict[str, Any]) -> bytes | None:
        if self.kind != "chat":
            return None
        history = conv.lookup_messages(body["messages"])
        return None if history is None else conv.fingerprint_key(tenant, model, history)

    def file_key(
        self, tenant: str, model: str | None, body: dict[str, Any], reply: Any
    ) -> bytes | None:
        if self.kind != "chat" or not reply:
            return None
        messages = [*body["messages"], conv.reply_message(reply)]
        return conv.fingerprint_key(tenant, model, messages)

    def result_from_response(self, payload: dict[str, Any]) -> DecodeResult:
        result = DecodeResult(params=protocol.kv_params_of(payload))
        result.prompt_ids = protocol.prompt_ids_of(payload)
        result.output_ids = protocol.output_ids_of(payload) or []
        choices = payload.get("choices") or []
        if choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            if isinstance(message, dict):
                result.reply = message
            reason = choices[0].get("finish_reason")
            result.finish_reason = str(reason) if reason is not None else None
            result.finished = reason is not None and reason != "error"
        return result

    def client_payload(self, payload: dict[str, Any], *, keep_token_ids: bool) -> dict[str, Any]:
        return protocol.client_payload(payload, keep_token_ids=keep_token_ids)

    def event_stream(self) -> EventStream | None:
        return None

    def error_body(self, exc: ApiError) -> dict[str, Any]:
        return exc.body()
