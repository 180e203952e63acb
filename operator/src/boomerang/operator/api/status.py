"""The status the operator writes: per-role counts, the router, the effective kv-transfer
settings and standard conditions.

Why a module of its own: status is the operator's output, built by `operator/status.py` from
these types so that it holds exactly the fields the CRD declares; it is never parsed back into
them (a status an older operator wrote must never block a reconcile).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from boomerang.operator.api.fields import Model


class RoleStatus(Model):
    """Observed replicas of one role."""

    desired: int = Field(0, description="Replicas asked for.")
    ready: int = Field(0, description="Replicas ready to serve.")
    updated: int = Field(0, description="Replicas running the current revision.")
    scaler: str | None = Field(
        None, description="The DisaggregatedRoleScaler `desired` comes from (replicasFrom: Scaler)."
    )


class RouterStatus(Model):
    """Observed state of the router."""

    desired: int = Field(0, description="Router replicas asked for.")
    ready: int = Field(0, description="Router replicas ready.")
    url: str | None = Field(None, description="In-cluster URL of the OpenAI-compatible API.")


class PathShares(Model):
    """How the router served its turns: percent of turns per path."""

    pull: int = Field(description="Percent of turns that pulled the history from D.")
    recompute: int = Field(description="Percent of turns P computed in full.")
    continue_: int = Field(
        alias="continue", description="Percent of turns that continued on the D holding them."
    )


class EffectiveKVTransfer(Model):
    """The kv-transfer settings the engines and router actually run with, defaults resolved."""

    bidirectional: bool = Field(description="D->P reuse enabled.")
    recompute_threshold: int = Field(description="Tokens below which P recomputes.")
    decoder_blocks_ttl_seconds: int = Field(
        alias="decoderBlocksTTLSeconds", description="D's block retention in seconds."
    )
    lease_duration_seconds: int = Field(description="P's lease in seconds.")
    router_conversation_ttl_seconds: int = Field(
        alias="routerConversationTTLSeconds", description="Router's handle TTL in seconds."
    )
    backend: str = Field(description="NIXL backend in use.")
    load_failure_policy: str = Field(description="P's policy on failed KV reads.")
    mode: str = Field(description="Tuning mode in force: Static or Adaptive.")
    break_even_tokens: int | None = Field(
        None,
        description="Adaptive: the learned pull/recompute break-even, in history tokens "
        "(read from the router).",
    )
    retention_seconds: int | None = Field(
        None, description="Adaptive: how long the router now keeps a handle on D, learned."
    )
    path_shares: PathShares | None = Field(
        None, description="Adaptive: percent of turns per path since the router started."
    )
    retained_blocks: int | None = Field(
        None, description="Adaptive: KV blocks retained handles hold on D (the memory held)."
    )
    retained_percent: int | None = Field(
        None, description="Adaptive: those blocks as a percent of D's KV blocks."
    )
    tpot_bound_milliseconds: int | None = Field(
        None,
        description="Adaptive: the TPOT bound the router chooses paths for (tuning.slo: the "
        "one set, or derived from its measurements).",
    )
    ttft_bound_milliseconds_at1k: int | None = Field(
        None,
        alias="ttftBoundMillisecondsAt1kTokens",
        description="Adaptive: the TTFT bound of a 1,000-token prompt (a derived bound grows "
        "with the prompt).",
    )
    observed_at: str | None = Field(
        None,
        description="Adaptive: when the router reported these learned values (RFC 3339); kept "
        "while they stay the same, so a settled router writes no status.",
    )


class Condition(Model):
    """A standard Kubernetes condition."""

    type: str = Field(
        description="Ready, Progressing, Degraded, and kstatus' Reconciling and Stalled."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int = Field(0, description="Generation the condition was computed for.")


class DisaggregatedDeploymentStatus(Model):
    """Observed state, written only by the operator."""

    observed_generation: int = Field(0, description="Last spec generation reconciled.")
    prefill: RoleStatus = Field(
        default_factory=lambda: RoleStatus(), description="Prefill replicas."
    )
    decode: RoleStatus = Field(default_factory=lambda: RoleStatus(), description="Decode replicas.")
    router: RouterStatus = Field(
        default_factory=lambda: RouterStatus(), description="Router state."
    )
    kv_transfer: EffectiveKVTransfer | None = Field(
        None, description="Effective kv-transfer settings."
    )
    engine_revision: str | None = Field(
        None, description="Hash of the engine build both roles must run."
    )
    revision_skew: bool = Field(
        False, description="True while P and D run different engine revisions (mid-rollout)."
    )
    ready_generation: int | None = Field(
        None,
        description="The last generation at which every replica was ready: replicas missing "
        "at that generation are a fault (Degraded), at a newer one a change under way.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Degraded; Reconciling and Stalled mirror the last two.",
    )
