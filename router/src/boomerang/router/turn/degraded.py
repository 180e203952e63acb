"""Which path a turn takes when a role has no engine: P and D, one engine alone, or a 503.

Why it exists: a deployment with one replica per role rolls its pods one role at a time, and
while a pod restarts (a minute for a large model) that role has no engine. Clients must keep
being served, so the turn goes to one engine of the other role as a plain vLLM request (the
client's body without `kv_transfer_params`, the way a single engine is called): it computes the
whole prompt and retains nothing, so no handle is attached to it or filed from it, and reuse
stays exact. `single_engine_fallback: false` keeps the 503.

A role's supply is what `Pool.candidates` offers: healthy engines, only ejected ones (it offers
those rather than none), or none. A role with only ejected engines is skipped when the other
role has a healthy one: its engines failed repeatedly and no probe has found them well since.
The decisions are pure and table-tested: `route` at the start of a turn, `after_failure` once
every engine of a role failed for the turn.
"""

from __future__ import annotations

from typing import Literal

from boomerang.router.engines.endpoints import Pool, Role

Supply = Literal["healthy", "ejected", "none"]
Route = Literal["pd", "prefill", "decode"]
"""The turn's path: P then D, or one engine of the named role alone."""


def supply(pool: Pool) -> Supply:
    """What the pool offers a turn now."""
    candidates = pool.candidates()
    if not candidates:
        return "none"
    return "ejected" if all(ep.ejected for ep in candidates) else "healthy"


def route(prefill: Supply, decode: Supply, *, fallback: bool) -> Route | None:
    """The path for these supplies; None: no engine can serve (503)."""
    if fallback and prefill != decode and "healthy" in (prefill, decode):
        return "prefill" if prefill == "healthy" else "decode"
    if prefill != "none" and decode != "none":
        return "pd"
    if fallback and prefill != "none":
        return "prefill"
    if fallback and decode != "none":
        return "decode"
    return None


def serving(prefill_ready: int, decode_ready: int, *, fallback: bool) -> bool:
    """Whether the router can serve turns now (its readiness): P and D, or with the fallback one
    role alone. A router that went unready whenever one role restarts would leave its Service
    without endpoints exactly when the other role could still answer."""
    if prefill_ready and decode_ready:
        return True
    return fallback and bool(prefill_ready or decode_ready)


def after_failure(failed: Role, other: Supply, *, fallback: bool) -> Role | None:
    """The role that serves alone once every engine of `failed` failed for the turn (`other`:
    what the other role offers); None: the turn fails."""
    return other_role(failed) if fallback and other != "none" else None


def other_role(role: Role) -> Role:
    """Prefill for decode, decode for prefill."""
    return "decode" if role == "prefill" else "prefill"


def no_engine_message(prefill: Supply, decode: Supply) -> str:
    """The 503's message, naming the roles that have no engine."""
    roles = [role for role, s in (("prefill", prefill), ("decode", decode)) if s == "none"]
    return f"no {' or '.join(roles)} engine is available"


def reason(role: Role, left: Supply) -> str:
    """Why a turn went without `role`, for the log."""
    return f"no {role} engine is listed" if left == "none" else f"every {role} engine is ejected"
