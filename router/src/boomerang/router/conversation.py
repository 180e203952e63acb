"""Conversations, handles and the exact reuse check (pure).

Identity. A conversation is found by the client's `conversation_id` or, when there is none, by
a fingerprint of its content: after a turn the router files D's handle under the hash of
(messages + the assistant reply it returned); the next turn looks up the hash of its messages
up to the last assistant message. Both keys are scoped to the caller's tenant, so one tenant can
never look up, let alone attach, another tenant's blocks. A key is only an index: it may find
the wrong handle (a regenerated reply, an edited message, a reused id) without harm, because:

Verification. A handle stores hashes of the exact token ids D holds: the first
`remote_num_tokens` ids of D's prompt + output (D's last sampled token was never fed through
the model). One 128-bit hash covers all of them; a chain of 64-bit hashes covers them block by
block at D's block size (`block_hashes`), 8 bytes per full block. Before attaching the handle
to P, the router obtains the new prompt's token ids (from the request when it is a token-id
prompt, otherwise from the prefill engine's own `/tokenize`, rendering the chat with the same
template arguments as the completion endpoint) and decides (`reuse.decide`): a *hit* when the
new prompt is strictly longer and its first `remote_num_tokens` ids hash to the full value (the
whole handle is attached); otherwise a *partial* reuse of the longest run of leading whole
blocks whose chained hashes the new prompt reproduces (KV of the first L tokens depends only on
those L tokens, so those blocks are valid for it), with the handle narrowed to them; otherwise
*rejected*. Edited history, regenerated turns, stripped reasoning and re-tokenised text change
the ids from the first difference on: the blocks before it are reused, nothing after it.
Cost: one tokenize call on the reuse path only, 16 bytes plus 8 per block of D per handle.
As a safety net the router compares P's returned prompt ids with the tokenized ones after the
fact and counts any difference (template drift between `/tokenize` and the chat endpoint).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from boomerang.router import params_codec

DIGEST_BYTES = 16
BLOCK_DIGEST_BYTES = 8
"""Bytes of each chained per-block hash (see `block_hashes` for why 8)."""


def _le_bytes(ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32s; raises TypeError/OverflowError on anything else."""
    arr = array("I", ids)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def token_hash(ids: Sequence[int]) -> bytes:
    """A 128-bit digest of a token id sequence (little-endian uint32 each)."""
    return hashlib.blake2b(_le_bytes(ids), digest_size=DIGEST_BYTES).digest()


def block_hashes(ids: Sequence[int], block_size: int) -> bytes:
    """Chained hashes of the whole blocks of `ids`, 8 bytes each, concatenated.

    h_i = blake2b-64(h_{i-1} || ids of block i), h_{-1} empty: like vLLM's own prefix-cache
    block hashes, h_i commits to every id of blocks 0..i, so a prompt reproducing h_i has the
    exact (i+1)*B-token prefix D's first i+1 blocks hold, not merely one equal block. A
    trailing partial block is not hashed (only whole blocks are ever reused).

    Why 64 bits, when a wrong reuse silently produces wrong KV: the router walks the new
    prompt's chain and stops at the first digest that differs, so a wrong reuse needs the first
    differing block's digest to collide, one chance in 2^64 per turn; at a million partial
    checks a second that is one expected in about 580,000 years. Chosen collisions (about 2^32
    work by the birthday bound) need control of both sequences, which only the conversation's
    own tenant has (keys are tenant-scoped): it could corrupt only its own answer. Full hits
    keep the 128-bit `token_hash`. 16 bytes per block would double the largest part of a
    stored conversation (64 blocks: 1 KiB of hashes alone at 8k tokens in 128-token blocks).
    """
    return _chain(_le_bytes(ids), block_size, len(ids) // block_size if block_size > 0 else 0)


def _chain(raw: bytes, block_size: int, n_blocks: int) -> bytes:
    return b"".join(_digests(raw, block_size, n_blocks))


def _digests(raw: bytes, block_size: int, n_blocks: int) -> Iterator[bytes]:
    """h_0, h_1, ... of the first `n_blocks` blocks of `raw` (uint32 ids)."""
    step, new = 4 * block_size, hashlib.blake2b
    prev = b""
    for at in range(0, n_blocks * step, step or 1):
        prev = new(prev + raw[at : at + step], digest_size=BLOCK_DIGEST_BYTES).digest()
        yield prev  # one constructor call per block: half the cost of new() + update()


def matching_blocks(stored: bytes, ids: Sequence[int], block_size: int, limit: int) -> int:
    """How many leading blocks of `ids` (at most `limit`) reproduce the stored chain; hashing
    stops at the first block that differs."""
    if block_size <= 0:
        return 0
    d = BLOCK_DIGEST_BYTES
    limit = min(limit, len(stored) // d, len(ids) // block_size)
    if limit <= 0:
        return 0
    try:
        raw = _le_bytes(ids[: limit * block_size])
    except (TypeError, OverflowError):
        return 0  # not token ids
    for i, digest in enumerate(_digests(raw, block_size, limit)):
        if digest != stored[i * d : (i + 1) * d]:
            return i
    return limit


def _key(*parts: str) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


def id_key(tenant: str, conversation_id: str) -> bytes:
    """Store key of a client-named conversation."""
    return _key("id", tenant, conversation_id)


def session_key(tenant: str, session: str, root: str | None) -> bytes:
    """Store key of one conversation under an agent's session: the session's name and the
    conversation's root (`sessions.conversation_root`), so that conversations sharing a name
    (sub-agents under their parent's session id, a gateway's one id per user, a shared
    `prompt_cache_key`) keep their own handles; None: the session alone (where its
    conversations' placement is remembered, an affinity hint for a new one)."""
    return _key("session", tenant, session) if root is None else _key("root", tenant, session, root)


def fingerprint_key(tenant: str, model: str | None, messages: Sequence[Any]) -> bytes:
    """Store key of a conversation identified by its content up to here."""
    canon = json.dumps([_canonical(m) for m in messages], separators=(",", ":"), sort_keys=True)
    return _key("fp", tenant, model or "", canon)


def history_key(tenant: str, kind: str, model: str | None, canonical: Sequence[Any]) -> bytes:
    """Store key of a conversation of another API (`kind`: responses, messages) by its
    history, already in the API's canonical form (`apis/`)."""
    canon = json.dumps(canonical, separators=(",", ":"), sort_keys=True)
    return _key("fp-" + kind, tenant, model or "", canon)


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
    """D's kv_transfer_params in `params_codec`'s compact form (most of a handle's bytes)."""
    prefix_hash: bytes
    """`token_hash` of the first `num_tokens` ids D holds."""
    num_tokens: int
    decode_url: str
    """The decode pod that holds the blocks (the next turn prefers it)."""
    expires_at: float
    """Router wall clock after which the handle is not offered."""
    block_size: int = 0
    """D's KV block size in tokens; 0 when unknown or unusable (then only full hits)."""
    block_hashes: bytes = b""
    """`block_hashes` of those ids at `block_size`: one 8-byte digest per whole block."""
    released: bool = False
    """D's lease of the blocks was released (adaptive retention): D no longer pins them, but
    its prefix cache keeps them until it needs the room. Never offered to P (nothing to
    read); only the continue path on `decode_url` may use it, where D's cache lookup by token
    hashes serves whatever of the history it still has, exactly."""

    def kv_params(self) -> dict[str, Any]:
        """D's params as a mapping, for P's request; ValueError when unreadable."""
        return params_codec.unpack(self.params)

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
        """Serialised form for a shared store: 7 fields, and an 8th (true) only when released.
        During a rolling upgrade a router from before the flag reads every pinned handle and
        refuses a released one as malformed, so it never offers one to P. `decode` also reads
        the older 5-field form."""
        fields: list[Any] = [
            base64.b64encode(self.params).decode(),
            self.prefix_hash.hex(),
            self.num_tokens,
            self.decode_url,
            self.expires_at,
            self.block_size,
            self.block_hashes.hex(),
        ]
        if self.released:
            fields.append(True)
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Handle:
        """Inverse of `encode`; raises ValueError on garbage.

        The 5-field form of earlier versions (no block hashes) decodes with block size 0: it
        still allows full hits, never a partial reuse.
        """
        try:
            fields = json.loads(raw)
            if not isinstance(fields, list) or len(fields) not in (5, 7, 8):
                raise ValueError("not a list of 5, 7 or 8 fields")
            padding: list[Any] = [0, "", False][len(fields) - 5 :]  # 5 and 7: not released
            params, digest, n, url, exp, size, hashes, released = [*fields, *padding]
            if not isinstance(released, bool):
                raise ValueError("released is not a boolean")
            handle = cls(
                base64.b64decode(params, validate=True),
                bytes.fromhex(digest),
                int(n),
                str(url),
                float(exp),
                int(size),
                bytes.fromhex(hashes),
                released,
            )
        except (TypeError, ValueError, AttributeError, KeyError, binascii.Error) as exc:
            raise ValueError(f"malformed handle: {exc}") from None
        if not handle.consistent():
            raise ValueError("malformed handle: block hashes do not fit its tokens")
        return handle

    def consistent(self) -> bool:
        """One 8-byte digest per whole block of `num_tokens` (none without a block size)."""
        if self.block_size < 0 or self.num_tokens < 0:
            return False
        whole = self.num_tokens // self.block_size if self.block_size else 0
        return len(self.block_hashes) == whole * BLOCK_DIGEST_BYTES


def usable_block_size(params: dict[str, Any], block_size: int | None) -> tuple[int, str | None]:
    """D's block size when its params allow a partial reuse later, else (0, why not).

    Partial reuse cuts `remote_block_ids` to the first k blocks, which is only meaningful with
    one KV-cache group (hybrid models have several, with different block semantics). The block
    count must also be what `remote_num_tokens` fills at that block size: a cheap check that the
    size learned from the engine is still the engine's.
    """
    if not block_size:
        return 0, "unknown_block_size"
    groups = params.get("remote_block_ids")
    n = params.get("remote_num_tokens")
    if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], list)):
        return 0, "groups"
    if not isinstance(n, int) or len(groups[0]) != -(-n // block_size):
        return 0, "block_count"
    return block_size, None


def build_handle(
    params: dict[str, Any],
    held_ids: Sequence[int],
    decode_url: str,
    expires_at: float,
    block_size: int = 0,
) -> Handle | None:
    """A handle for D's retained params, or None when D's tokens do not cover what it holds.

    `block_size` > 0 (from `usable_block_size`) adds the per-block hashes partial reuse needs.
    """
    n = params.get("remote_num_tokens")
    if not isinstance(n, int) or n <= 0 or len(held_ids) < n:
        return None
    try:
        raw = _le_bytes(held_ids[:n])
    except (TypeError, OverflowError):
        return None  # not token ids
    digest = hashlib.blake2b(raw, digest_size=DIGEST_BYTES).digest()
    size = max(block_size, 0)
    chain = _chain(raw, size, n // size) if size else b""
    compact = params_codec.pack(params)
    return Handle(compact, digest, n, decode_url, expires_at, size, chain)
