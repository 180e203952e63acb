"""Conversations, handles and the exact reuse check (pure).

Identity. A conversation is found by the client's `conversation_id` or, when there is none, by
a fingerprint of its content: after a turn the router files D's handle under the hash of
(messages + the assistant reply it returned); the next turn looks up the hash of its messages
up to the last assistant message. Both keys are scoped to the caller's tenant, so one tenant can
never look up, let alone attach, another tenant's blocks. A key is only an index: it may find
the wrong handle (a regenerated reply, an edited message, a reused id) without harm, because:

Verification. A handle stores a hash of the exact token ids D holds: the first
`remote_num_tokens` ids of D's prompt + output (D's last sampled token was never fed through
the model). Before attaching the handle to P, the router obtains the new prompt's token ids
(from the request when it is a token-id prompt, otherwise from the prefill engine's own
`/tokenize`, rendering the chat with the same template arguments as the completion endpoint),
and attaches the handle only when the new prompt is strictly longer and its first
`remote_num_tokens` ids hash to the stored value. Edited history, regenerated turns, stripped
reasoning and re-tokenised text all change the ids, so they fail the check and the turn is
computed from scratch. Cost: one tokenize call on the reuse path only, and 16 bytes per handle.
As a safety net the router compares P's returned prompt ids with the tokenized ones after the
fact and counts any difference (template drift between `/tokenize` and the chat endpoint).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

DIGEST_BYTES = 16


def token_hash(ids: Sequence[int]) -> bytes:
    """A 128-bit digest of a token id sequence (little-endian uint32 each)."""
    arr = array("I", ids)
    if sys.byteorder == "big":
        arr.byteswap()
    return hashlib.blake2b(arr.tobytes(), digest_size=DIGEST_BYTES).digest()


def _key(*parts: str) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


def id_key(tenant: str, conversation_id: str) -> bytes:
    """Store key of a client-named conversation."""
    return _key("id", tenant, conversation_id)


def fingerprint_key(tenant: str, model: str | None, messages: Sequence[Any]) -> bytes:
    """Store key of a conversation identified by its content up to here."""
    canon = json.dumps([_canonical(m) for m in messages], separators=(",", ":"), sort_keys=True)
    return _key("fp", tenant, model or "", canon)


def lookup_messages(messages: Sequence[Any]) -> list[Any] | None:
    """The messages up to and including the last assistant message (None if there is none)."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if isinstance(msg, dict) and msg.get("role") == "assistant":
            return list(messages[: i + 1])
    return None


def _canonical(msg: Any) -> list[Any]:
    """Role, text and tool calls: what clients echo back; reasoning and nulls are ignored."""
    if not isinstance(msg, dict):
        return [repr(msg)]
    content = msg.get("content")
    if isinstance(content, list):
        content = [p.get("text") if p.get("type") == "text" else p for p in content]
        if all(isinstance(p, str) for p in content):
            content = "".join(content)
    calls = [
        [(c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
        for c in msg.get("tool_calls") or ()
        if isinstance(c, dict)
    ]
    return [msg.get("role"), content or "", calls, msg.get("tool_call_id"), msg.get("name")]


def reply_message(response_message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as a client will send it back next turn."""
    return {
        "role": "assistant",
        "content": response_message.get("content"),
        "tool_calls": response_message.get("tool_calls"),
    }


@dataclass(slots=True)
class Handle:
    """D's retained blocks for one conversation: what P needs, and what they hold."""

    params: bytes
    """D's kv_transfer_params, compact JSON, zlib-compressed (block id lists compress well;
    this keeps a stored conversation under 1 KB with a long history)."""
    prefix_hash: bytes
    """`token_hash` of the first `num_tokens` ids D holds."""
    num_tokens: int
    decode_url: str
    """The decode pod that holds the blocks (the next turn prefers it)."""
    expires_at: float
    """Router wall clock after which the handle is not offered."""

    def kv_params(self) -> dict[str, Any]:
        """D's params as a mapping, for P's request."""
        value: dict[str, Any] = orjson.loads(zlib.decompress(self.params))
        return value

    def matches(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the new prompt strictly extends the exact token sequence D holds."""
        n = self.num_tokens
        if len(prompt_ids) <= n:
            return False
        try:
            return token_hash(prompt_ids[:n]) == self.prefix_hash
        except (TypeError, OverflowError):
            return False

    def encode(self) -> bytes:
        """Serialised form for a shared store."""
        return json.dumps(
            [
                base64.b64encode(self.params).decode(),
                self.prefix_hash.hex(),
                self.num_tokens,
                self.decode_url,
                self.expires_at,
            ],
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Handle:
        """Inverse of `encode`; raises ValueError on garbage."""
        try:
            params, digest, n, url, exp = json.loads(raw)
            blob = base64.b64decode(params, validate=True)
            return cls(blob, bytes.fromhex(digest), int(n), str(url), float(exp))
        except (TypeError, ValueError, AttributeError, binascii.Error) as exc:
            raise ValueError(f"malformed handle: {exc}") from None


def build_handle(
    params: dict[str, Any],
    held_ids: Sequence[int],
    decode_url: str,
    expires_at: float,
) -> Handle | None:
    """A handle for D's retained params, or None when D's tokens do not cover what it holds."""
    n = params.get("remote_num_tokens")
    if not isinstance(n, int) or n <= 0 or len(held_ids) < n:
        return None
    try:
        digest = token_hash(held_ids[:n])
    except (TypeError, OverflowError):
        return None  # not token ids
    compact = _compress(orjson.dumps(params))
    return Handle(compact, digest, n, decode_url, expires_at)


def _compress(raw: bytes) -> bytes:
    """zlib with a 2 KiB window: as small as the default for D's params (a few KiB of JSON) but
    about 5x faster, because the default's 256 KiB of state per call dominated the cost.
    Plain `zlib.decompress` reads it (and handles stored by earlier versions)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 11, 4)
    return packer.compress(raw) + packer.flush()
