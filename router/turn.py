"""The state of one client request while it crosses P and D, and what may change it.

Kept apart from the flow so the rules about a turn's handle (taken, attached, spent) read in
one place: a handle P may have seen is spent and never offered again.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from boomerang.router import conversation as conv
from boomerang.router import logs
from boomerang.router.validation import ClientRequest


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
    holder: str | None = None
    p_ep: Any = None
    """The prefill engine chosen for the turn (tokenize and prefill go to the same one)."""
    outcome: str = "miss"
    prompt_ids: list[int] | None = None
    first_sent: bool = False
    decode_url: str | None = None

    def engine_request_id(self, stage: str) -> str:
        """A fresh id for each engine call (`<prefix>-p1`, `<prefix>-d2`, ...): the engines'
        logs and the response `id` then name the router's request."""
        self.engine_calls += 1
        return f"{self.engine_id_prefix}-{stage}{self.engine_calls}"

    def spend_handle(self) -> None:
        """P saw the attached handle: it must never be offered again."""
        if self.attached is not None:
            self.attached = None
            self.taken = None
            self.outcome = "fallback"
