"""The state of one client request while it crosses P and D, and what may change it.

Kept apart from the flow so the rules about a turn's handle (taken, attached, spent) read in
one place: a handle P may have seen is spent and never offered again. A partial reuse attaches
the handle like a hit does (narrowed params): every rule about an attached handle is the same.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Final

from boomerang.router import conversation as conv
from boomerang.router import logs
from boomerang.router.endpoints import Role
from boomerang.router.validation import ClientRequest

ATTACHED: Final = ("hit", "partial")
"""Outcomes of a turn whose handle is attached (until P accepts it or it is spent)."""


def _engine_id_prefix() -> str:
    """The request's id plus eight random hex digits: clients may reuse their own
    `X-Request-Id`, and no engine should see one id on two live requests."""
    return f"{logs.request_id.get()}-{os.urandom(4).hex()}"


@dataclass
class Turn:
    """The state of one client request while it crosses P and D."""

    req: ClientRequest
    tenant: str
    started: float = field(default_factory=time.perf_counter)
    engine_id_prefix: str = field(default_factory=_engine_id_prefix)
    engine_calls: int = 0
    lookup_key: bytes | None = None
    taken: conv.Handle | None = None
    attached: conv.Handle | None = None
    attached_params: dict[str, Any] | None = None
    """D's params as P gets them: the handle's own (hit) or narrowed to k blocks (partial)."""
    reused_tokens: int = 0
    """Tokens of the prompt P may pull from D when the outcome is hit or partial."""
    holder: str | None = None
    p_ep: Any = None
    """The prefill engine chosen for the turn (tokenize and prefill go to the same one)."""
    outcome: str = "miss"
    prompt_ids: list[int] | None = None
    first_sent: bool = False
    decode_url: str | None = None
    alone: Role | None = None
    """The role of the one engine that served the turn alone (the other had none), else None."""

    def engine_request_id(self, stage: str) -> str:
        """A fresh id for each engine call (`<prefix>-p1`, `<prefix>-d2`, ...): the engines'
        logs and the response `id` then name the router's request."""
        self.engine_calls += 1
        return f"{self.engine_id_prefix}-{stage}{self.engine_calls}"

    def find_key(self, fingerprint: bool) -> bytes | None:
        """Where this turn's conversation's handle is: the client's `conversation_id`, else
        (chat, fingerprints on) the messages up to the last assistant message."""
        req = self.req
        if req.conversation_id is not None:
            return conv.id_key(self.tenant, req.conversation_id)
        if req.kind != "chat" or not fingerprint:
            return None
        history = conv.lookup_messages(req.body["messages"])
        return None if history is None else conv.fingerprint_key(self.tenant, req.model, history)

    def file_key(self, fingerprint: bool, reply: dict[str, Any] | None) -> bytes | None:
        """Where the next turn will look: the `conversation_id`, else the messages plus D's
        `reply` as the client will send it back."""
        req = self.req
        if req.conversation_id is not None:
            return conv.id_key(self.tenant, req.conversation_id)
        if req.kind != "chat" or not fingerprint or not reply:
            return None
        messages = [*req.body["messages"], conv.reply_message(reply)]
        return conv.fingerprint_key(self.tenant, req.model, messages)

    def summary(self) -> dict[str, Any]:
        """The fields of the per-turn log line."""
        return {
            "kind": self.req.kind,
            "stream": self.req.stream,
            "reuse": self.outcome,
            "reused_tokens": self.reused_tokens if self.outcome in ATTACHED else 0,
            "prefill": getattr(self.p_ep, "url", None),
            "decode": self.decode_url,
            "holder": self.holder,
            "alone": self.alone,
            "prompt_tokens": len(self.prompt_ids) if self.prompt_ids is not None else None,
            "seconds": round(time.perf_counter() - self.started, 4),
        }

    def spend_handle(self) -> None:
        """P saw the attached handle: it must never be offered again."""
        if self.attached is not None:
            self.attached = self.attached_params = None
            self.taken = None
            self.reused_tokens = 0
            self.outcome = "fallback"
