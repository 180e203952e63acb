"""One client request crossing P and D, and the life of its conversation's handle in it.

Why it exists: reuse is exact only if a handle P may have seen is never offered again, and one
P never saw goes back to the store. Those rules are a small state machine, kept here apart
from the I/O (`flow.py` takes, tokenizes and restores, `legs.py` calls) so that each transition is
explicit, checked, and tested alone (`test_turn.py`):

| transition | from            | to                                                            |
|------------|-----------------|---------------------------------------------------------------|
| take       | NONE            | TAKEN, when the store gave a handle its decoder still holds   |
| verify     | TAKEN           | VERIFIED (hit, partial), DROPPED (rejected), TAKEN (no ids)   |
| attach     | VERIFIED        | ATTACHED: D's params are on a prefill request                 |
| unsent     | ATTACHED        | VERIFIED: that request certainly never reached P              |
| spend      | ATTACHED        | SPENT: P answered (the outcome stands) or failed (fallback)   |
| detach     | VERIFIED        | TAKEN: the turn goes to one engine alone (`degraded.py`)      |
| restore    | TAKEN, VERIFIED | RESTORED: back to the store, unused (fallback)                |
| restore    | ATTACHED        | SPENT: the turn was cancelled mid-prefill; P may be reading it |
| decline    | VERIFIED        | RELEASED: the cost model chose recompute; D's blocks can go   |
| forgo      | TAKEN           | RELEASED: P already holds the history (static): not verified  |
| supersede  | VERIFIED        | RELEASED: a continued turn's D filed a fresh handle           |

The outcome follows: miss, expired, or fallback (a void handle) when nothing is taken; fallback
while taken; the decision once verified; fallback again whenever the turn is computed without
it. A handle P may have seen (its read, or its decision not to read, frees D's blocks) is
never offered again; a rejected one is dropped (D's blocks hold nothing this prompt can use).
A partial reuse attaches the handle like a hit (narrowed params): every rule is the same.

A continued turn (`legs.Continue`, adaptive mode) goes to the decoder holding the history without
attaching the handle to anything: D serves the history from its own prefix cache, and the
handle's blocks stay pinned under the old request. So the handle stays VERIFIED while D works:
once D answered and its fresh handle is filed, the old one is superseded; if D failed before
the client got a byte the turn falls back to P with it still VERIFIED (P never saw it); if the
turn ends otherwise it is restored (still valid). A continued turn keeps its verified outcome.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from boomerang.router import apis, logs
from boomerang.router import conversation as conv
from boomerang.router.apis import DecodeResult, sessions
from boomerang.router.apis.validation import ClientRequest
from boomerang.router.engines.endpoints import Endpoint, Role
from boomerang.router.learning.costmodel import Path
from boomerang.router.retention.claims import Claim
from boomerang.router.store import TakeStatus
from boomerang.router.turn.affinity import Placement
from boomerang.router.turn.cache_salt import FIELD as SALT_FIELD
from boomerang.router.turn.reuse import ATTACHED, Outcome, Reuse


class Stage(Enum):
    """Where the turn's handle is (see the module docstring)."""

    NONE = "none"
    TAKEN = "taken"
    VERIFIED = "verified"
    ATTACHED = "attached"
    SPENT = "spent"
    DROPPED = "dropped"
    RESTORED = "restored"
    RELEASED = "released"


MOVES: Final = frozenset(
    {
        (Stage.NONE, Stage.TAKEN),  # take
        (Stage.TAKEN, Stage.VERIFIED),  # verify: hit or partial
        (Stage.TAKEN, Stage.DROPPED),  # verify: rejected
        (Stage.VERIFIED, Stage.ATTACHED),  # attach
        (Stage.ATTACHED, Stage.VERIFIED),  # unsent
        (Stage.ATTACHED, Stage.SPENT),  # spend, or restore mid-prefill
        (Stage.VERIFIED, Stage.RELEASED),  # decline (recompute), supersede (continued)
        (Stage.TAKEN, Stage.RELEASED),  # forgo (P holds the history: not even verified)
        (Stage.VERIFIED, Stage.TAKEN),  # detach
        (Stage.TAKEN, Stage.RESTORED),  # restore
        (Stage.VERIFIED, Stage.RESTORED),  # restore
    }
)
"""Every transition the handle may make; any other is a bug (`IllegalMove`)."""


class IllegalMove(RuntimeError):
    """A transition the handle's state machine does not allow."""


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
    stage: Stage = Stage.NONE
    outcome: Outcome = Outcome.MISS
    lookup_key: bytes | None = None
    filed_key: bytes | None = None
    """Where D's handle and the placement were filed for the next turn (`Serving._file_key`)."""
    key_filed: bool = False
    """`filed_key` is worked out (None can be its value: nothing to file under)."""
    handle: conv.Handle | None = None
    """The handle taken from the store (until it is spent, dropped or restored)."""
    reuse: Reuse | None = None
    """The verified decision: D's params as P gets them and the tokens P may pull."""
    holder: str | None = None
    """The decode engine that holds the conversation (decode prefers it)."""
    p_ep: Endpoint | None = None
    """The prefill engine chosen for the turn (tokenize and prefill go to the same one)."""
    prompt_ids: list[int] | None = None
    block_hashes: list[int] | None = None
    """The prompt's blocks as the engines' KV events name them (`serving.Serving._hashes`)."""

    first_sent: bool = False
    first_at: float = 0.0
    """`perf_counter` when the client got the first byte (0: not yet)."""
    on_first: Callable[[], None] | None = None
    """Called once with the first byte (a continued turn's D has then done its prefill)."""
    decode_url: str | None = None
    alone: Role | None = None
    """The role of the one engine that served the turn alone (the other had none), else None
    (`serve_alone`)."""
    chosen: Path | None = None
    """The plan's first leg, before any fallback; None: nothing verified to plan for."""
    continued: bool = False
    """The decoder holding the history answered the turn itself (`continued_on_holder`)."""
    placement: Placement | None = None
    """Where the conversation's previous turn ran (`affinity.py`); None: not known."""
    claim: Claim | None = None
    """D's answer to the claim of the taken handle's lease (`claims.py`); None: not asked."""
    p_cached: int | None = None
    """What P's answer says it did not compute of the prompt (its prefix-cache hit plus what
    it pulled from D; `usage.py`); None: P did not say, or no P served the turn."""
    retention_learned_s: float | None = None
    """The learned retention in force for the tenant when D's handle was filed (adaptive)."""
    answer: DecodeResult | None = None
    """The last engine answer relayed to the client (`answered`); None: none was."""
    failure: str | None = None
    """Why the turn was not served (the error the client got), for its log line."""

    # -- the handle's state machine ---------------------------------------------------------

    def _move(self, to: Stage) -> None:
        if (self.stage, to) not in MOVES:
            raise IllegalMove(f"a handle cannot go from {self.stage.name} to {to.name}")
        self.stage = to

    def take(self, status: TakeStatus, handle: conv.Handle | None, usable: bool) -> None:
        """What the store gave: nothing (miss), an expired handle, a void one (`usable` false:
        its decoder may have lost the blocks: fallback), or a handle to verify."""
        if handle is None:
            self.outcome = Outcome.EXPIRED if status == "expired" else Outcome.MISS
            return
        self.holder = handle.decode_url
        if not usable:
            self.outcome = Outcome.FALLBACK
            return
        self._move(Stage.TAKEN)
        self.handle, self.outcome = handle, Outcome.FALLBACK  # until verified

    def planned(self, path: Path) -> None:
        """The plan's choice (`plan.py`), for the log."""
        self.chosen = path

    def serve_alone(self, role: Role) -> None:
        """One engine of `role` serves the turn: no handle is attached (a taken one is
        restored at the end)."""
        self.alone = role
        self.detach()

    def continued_on_holder(self) -> None:
        """The decoder holding the history answered (before any byte reached the client it was
        still undecided). A released handle's turn counts `cached`: D served it from its
        prefix cache, not from pinned blocks."""
        self.continued = True
        if self.handle is not None and self.handle.released:
            self.outcome = Outcome.CACHED

    def lease_gone(self) -> None:
        """D did not confirm the taken handle's lease (it yielded to pressure, expired, or D
        did not answer): the handle is treated as released, never offered to P; D's prefix
        cache may still serve a continued turn."""
        if self.handle is not None:
            self.handle = dataclasses.replace(self.handle, released=True)

    def verify(self, reuse: Reuse | None) -> None:
        """Record the reuse decision for the prompt (None: its ids are unknown, the handle is
        kept for the store and the turn computes without it)."""
        if reuse is None:
            if self.stage is not Stage.TAKEN:
                raise IllegalMove(f"nothing to verify in {self.stage.name}")
            return
        if reuse.params is None:
            self._move(Stage.DROPPED)
            self.handle, self.outcome = None, Outcome.REJECTED
            return
        self._move(Stage.VERIFIED)
        self.reuse, self.outcome = reuse, reuse.outcome

    def attach(self) -> dict[str, Any] | None:
        """D's params for the next prefill request; None when there are none to offer."""
        if self.stage is not Stage.VERIFIED:
            if self.stage is Stage.ATTACHED:
                raise IllegalMove("the handle is already on a prefill request")
            return None
        self._move(Stage.ATTACHED)
        assert self.reuse is not None
        return self.reuse.params

    def unsent(self) -> None:
        """The prefill request carrying the handle never reached P: the next one may carry it."""
        self._move(Stage.VERIFIED)

    def spend(self, *, accepted: bool) -> None:
        """P had the handle: it answered with it (`accepted`: the outcome stands) or failed
        (fallback). Either way it is never offered again."""
        self._move(Stage.SPENT)
        self.handle = None
        if not accepted:
            self._computed_without()

    def decline(self) -> conv.Handle:
        """The turn computes on P without the verified handle (the cost model chose
        recompute): it is never offered again; the handle, for its blocks to be released."""
        if self.stage is not Stage.VERIFIED:
            raise IllegalMove(f"only a verified handle is declined, not {self.stage.name}")
        return self._let_go(computed_without=True)

    def forgo(self) -> conv.Handle:
        """The turn will not use the handle at all, unverified (static mode, P already holds
        the history): never offered again; the handle, for its blocks to be released."""
        if self.stage is not Stage.TAKEN:
            raise IllegalMove(f"only a taken handle is forgone, not {self.stage.name}")
        return self._let_go(computed_without=True)

    def supersede(self) -> conv.Handle:
        """A continued turn's D answered and its fresh handle is filed: the old one is never
        offered again (the outcome stands); the handle, for its blocks to be released."""
        if not self.continued:
            raise IllegalMove("only a continued turn supersedes its handle")
        return self._let_go(computed_without=False)

    def _let_go(self, *, computed_without: bool) -> conv.Handle:
        handle = self.handle
        self._move(Stage.RELEASED)
        assert handle is not None
        self.handle = None
        if computed_without:
            self._computed_without()
        return handle

    def detach(self) -> None:
        """The turn is served by one engine alone: no handle is attached (a taken one is
        restored at the end), and a spent one did not serve the answer."""
        if self.stage is Stage.VERIFIED:
            self._move(Stage.TAKEN)
        if self.stage in (Stage.TAKEN, Stage.SPENT):
            self._computed_without()

    def restore(self) -> conv.Handle | None:
        """End the claim: the handle to put back in the store (one no P received), if any."""
        if self.stage is Stage.ATTACHED:
            self.spend(accepted=False)
        if self.stage not in (Stage.TAKEN, Stage.VERIFIED):
            return None
        handle = self.handle
        self._move(Stage.RESTORED)
        self.handle = None
        if not self.continued:  # a continued turn was served from the history all the same
            self._computed_without()
        return handle

    def _computed_without(self) -> None:
        self.reuse = None
        if self.outcome in ATTACHED:
            self.outcome = Outcome.FALLBACK

    @property
    def cache_salt(self) -> str | None:
        """The salt the engines get for this request (`cache_salt.py`; None: unsalted)."""
        salt = self.req.body.get(SALT_FIELD)
        return salt if isinstance(salt, str) and salt else None

    @property
    def reused_tokens(self) -> int:
        """Tokens of the prompt P may pull (or pulled) from D; 0 unless hit or partial."""
        return self.reuse.tokens if self.reuse is not None and self.outcome in ATTACHED else 0

    @property
    def reused_tokens_verified(self) -> int:
        """The verified reusable tokens (0 when nothing was verified), whatever the path."""
        return self.reuse.tokens if self.reuse is not None else 0

    @property
    def path(self) -> Path:
        """How the turn's prompt was served (`metrics.py`): continue, pull (P took D's
        handle), else recompute."""
        if self.continued:
            return Path.CONTINUE
        return Path.PULL if self.outcome in ATTACHED else Path.RECOMPUTE

    # -- bookkeeping ------------------------------------------------------------------------

    def engine_request_id(self, stage: str) -> str:
        """A fresh id for each engine call (`<prefix>-p1`, `<prefix>-d2`, ...): the engines'
        logs and the response `id` then name the router's request."""
        self.engine_calls += 1
        return f"{self.engine_id_prefix}-{stage}{self.engine_calls}"

    def find_keys(self, fingerprint: bool) -> list[bytes]:
        """Where this turn's conversation's handle may be, in the order to look: the client's
        `conversation_id` alone; else the agent's session, then (fingerprints on) the API's
        fingerprint of its history up to the model's last answer (`sessions.py`)."""
        req = self.req
        if req.conversation_id is not None:
            return [conv.id_key(self.tenant, req.conversation_id)]
        keys = [self.session_key] if req.session is not None else []
        if fingerprint:
            found = apis.of(req.kind).lookup_key(self.tenant, req.model, req.body)
            keys += [found] if found is not None else []
        return keys

    def file_key(self, fingerprint: bool, reply: dict[str, Any] | None) -> bytes | None:
        """Where the next turn will look first: the `conversation_id` or the session, else the
        messages plus D's `reply` as the client will send it back."""
        req = self.req
        if req.conversation_id is not None:
            return conv.id_key(self.tenant, req.conversation_id)
        if req.session is not None:
            return self.session_key
        if not fingerprint or not reply:
            return None
        return apis.of(req.kind).file_key(self.tenant, req.model, req.body, reply)

    @functools.cached_property
    def session_key(self) -> bytes:
        """The session's conversation this turn belongs to (`conv.session_key`; its root is
        hashed once a turn, for the lookup and the filing alike)."""
        assert self.req.session is not None
        root = sessions.conversation_root(self.req.kind, self.req.body)
        return conv.session_key(self.tenant, self.req.session.name, root)

    def session_wide_key(self) -> bytes | None:
        """Where the session's conversations' placement is also remembered: a conversation
        new to a named session starts where its siblings ran (their shared prefix is cached
        there), as an affinity hint; never a handle. None without a session."""
        if self.req.conversation_id is not None or self.req.session is None:
            return None
        return conv.session_key(self.tenant, self.req.session.name, None)

    def answered(self, result: DecodeResult) -> None:
        """An engine's answer was relayed to the client (the last one counts)."""
        self.answer = result

    @property
    def served(self) -> bool:
        """Whether the client got a whole answer: one the engine ended itself. A stream that
        broke off, an error, or a client that left is not a served turn."""
        return self.failure is None and self.answer is not None and self.answer.finished

    def _prompt_tokens(self) -> int | None:
        """The prompt's tokens: as the router tokenized it, else as D returned them."""
        if self.prompt_ids is not None:
            return len(self.prompt_ids)
        answer = self.answer
        return len(answer.prompt_ids) if answer is not None and answer.prompt_ids else None

    def summary(self) -> dict[str, Any]:
        """The fields of the per-turn log line."""
        answer = self.answer
        return {
            "finish_reason": answer.finish_reason if answer is not None else None,
            "completion_tokens": (len(answer.output_ids) or None) if answer is not None else None,
            "error": self.failure,
            "kind": self.req.kind,
            "stream": self.req.stream,
            "reuse": str(self.outcome),
            "reused_tokens": self.reused_tokens,
            "prefill": self.p_ep.url if self.p_ep is not None else None,
            "decode": self.decode_url,
            "holder": self.holder,
            "alone": self.alone,
            "path": str(self.path),
            "chosen": str(self.chosen) if self.chosen is not None else None,
            "prompt_tokens": self._prompt_tokens(),
            "cached_tokens": self.p_cached,
            "session": self.req.session.source if self.req.session is not None else None,
            # Digests of the keys the conversation was looked up and filed under: a turn's
            # `conversation` is its previous turn's `next` (a planner chains them, `boomsim`)
            "conversation": key_digest(self.lookup_key),
            "next": key_digest(self.filed_key),
            "retention_hint_s": self.req.retention.asked_s if self.req.retention else None,
            "retention_hint_applied_s": (
                self.req.retention.applied_s if self.req.retention else None
            ),
            "retention_learned_s": self.retention_learned_s,
            "carried_over": answer.carried_over if answer is not None else 0,
            "seconds": round(time.perf_counter() - self.started, 4),
        }


def key_digest(key: bytes | None) -> str | None:
    """A store key, as the per-turn log names it: 16 hex digits of its hash (a key holds the
    tenant and the conversation's id or history digest, which a log need not carry)."""
    return hashlib.blake2b(key, digest_size=8).hexdigest() if key else None
