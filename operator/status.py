"""Compute the resource's status from what its workloads report: a pure function.

Status is written on purpose, for people and for tools (`kubectl get`, Argo CD health checks):
per-role desired/ready/updated counts, the router's readiness and URL, the effective kv-transfer
settings, and three standard conditions (plus kstatus' Reconciling and Stalled, mirroring
Progressing and Degraded, for Flux and other kstatus readers):
- Ready: every role and the router have all their replicas ready at the current generation;
- Progressing: a rollout or scale is under way (including P and D at different revisions);
  its message says when decode's pods wait for prefill to roll out first (rollout.py);
- Degraded: the last reconcile failed, or replicas went missing after the current spec was
  Ready, with no rollout to explain it.
A condition's `lastTransitionTime` moves only when its status changes, so status never flaps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from boomerang.connector.config import ROLES
from boomerang.operator import render, rollout
from boomerang.operator.api import DisaggregatedDeployment, parse_duration


@dataclass(frozen=True)
class Workload:
    """The rollout state of one StatefulSet or Deployment, read from its status."""

    desired: int
    ready: int
    updated: int
    settled: bool  # controller caught up with the spec and no revision change pending
    held: bool = False  # a pending revision change the StatefulSet's partition holds back

    @property
    def complete(self) -> bool:
        return self.settled and self.ready >= self.desired and self.updated >= self.desired


def workload(obj: Mapping[str, Any] | None, desired: int) -> Workload:
    """Read a StatefulSet's or Deployment's status (None: not created yet)."""
    if not obj:
        return Workload(desired=desired, ready=0, updated=0, settled=False)
    status = obj.get("status") or {}
    generation = obj.get("metadata", {}).get("generation", 0)
    settled = status.get("observedGeneration", 0) >= generation
    held = False
    if obj.get("kind") == "StatefulSet":
        current, update = status.get("currentRevision"), status.get("updateRevision")
        settled = settled and (current == update or desired == 0)
        held = not settled and rollout.partition(obj) > 0
    return Workload(
        desired=desired,
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        settled=settled,
        held=held,
    )


def compute_status(
    dd: DisaggregatedDeployment,
    observed: Mapping[str, Mapping[str, Any] | None],
    previous: Mapping[str, Any] | None,
    now: str,
    error: str | None = None,
) -> dict[str, Any]:
    """The whole `.status` object; `observed` maps prefill/decode/router to their workloads."""
    generation = int(dd.metadata.get("generation") or 0)
    roles: dict[str, Workload] = {
        role: workload(observed.get(role), render.role_spec(dd, role).replicas) for role in ROLES
    }
    router = workload(observed.get("router"), dd.spec.router.replicas)
    skew = _revision_skew(roles["prefill"], roles["decode"])
    status: dict[str, Any] = {
        "observedGeneration": generation,
        **{role: _role_status(w) for role, w in roles.items()},
        "router": {
            "desired": router.desired,
            "ready": router.ready,
            "url": render.router_url(dd),
        },
        "kvTransfer": _effective_kv(dd),
        "engineRevision": render.engine_revision(dd),
        "revisionSkew": skew,
    }
    old = {c["type"]: c for c in (previous or {}).get("conditions", [])}
    # Ready once for this very spec: replicas missing since then are a fault. After a spec
    # change (a scale-up first seen with its new pods pending) they are the change under way.
    # Remembered as a generation, not read from the last Ready condition: a transient status
    # in between (pods deleted, the StatefulSet not yet caught up) would otherwise make a
    # resource that lost its pods look like one still rolling out, forever.
    was_ready = _ready_generation(previous) == generation
    decided = _decide(roles, router, skew, error, was_ready)
    if decided["Ready"][0]:
        status["readyGeneration"] = generation
    elif _ready_generation(previous) is not None:
        status["readyGeneration"] = _ready_generation(previous)
    status["conditions"] = [
        _condition(kind, value, reason, message, old.get(kind), now, generation)
        for kind, (value, reason, message) in decided.items()
    ]
    return status


def _ready_generation(previous: Mapping[str, Any] | None) -> int | None:
    """The last generation that had every replica ready (older operators did not record it:
    then a Ready condition of the status's own generation stands for it)."""
    if not previous:
        return None
    if "readyGeneration" in previous:
        return int(previous["readyGeneration"])
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in previous.get("conditions", [])
    )
    return int(previous.get("observedGeneration") or 0) if ready else None


Decision = tuple[bool, str, str]
KSTATUS_MIRRORS = frozenset({"Reconciling", "Stalled"})
"""kstatus' own condition types, which repeat Progressing and Degraded."""


def _decide(
    roles: Mapping[str, Workload],
    router: Workload,
    skew: bool,
    error: str | None,
    was_ready: bool,
) -> dict[str, Decision]:
    """Ready, Progressing and Degraded, each as (status, reason, message)."""
    everything = {**roles, "router": router}
    waiting = [
        f"{name} {w.ready}/{w.desired} ready" for name, w in everything.items() if not w.complete
    ]
    rolling = [
        f"{name} (waits for prefill to roll out first)" if w.held else name
        for name, w in everything.items()
        if not w.settled or w.updated < w.desired
    ]
    progressing: Decision = (False, "Stable", "all workloads at the desired revision")
    if skew:
        message = "prefill and decode run different engine revisions; NIXL needs them equal"
        if any(w.held for w in roles.values()):
            message += "; decode waits for prefill to roll out first"
        progressing = (True, "RevisionSkew", message)
    elif rolling:
        progressing = (True, "RollingOut", f"updating {', '.join(rolling)}")
    elif waiting:
        progressing = (True, "WaitingForReplicas", "; ".join(waiting))
    degraded: Decision = (False, "AsExpected", "no faults")
    if error is not None:
        degraded = (True, "ReconcileFailed", error)
    elif was_ready and waiting and not rolling:
        # Replicas were all ready and went away with no rollout to explain it.
        degraded = (True, "ReplicasUnavailable", "; ".join(waiting))
    ready: Decision = (True, "AllReplicasReady", "prefill, decode and router ready")
    if error is not None:
        ready = (False, "ReconcileFailed", error)
    elif waiting:
        ready = (False, "WaitingForReplicas", "; ".join(waiting))
    # kstatus (Flux's health checks, kpt, cli-utils) reads two abnormal-true conditions of its
    # own: Reconciling while work is under way, Stalled when it cannot proceed. They mirror
    # Progressing and Degraded, so every GitOps tool sees the same state.
    return {
        "Ready": ready,
        "Progressing": progressing,
        "Degraded": degraded,
        "Reconciling": progressing,
        "Stalled": degraded,
    }


def _revision_skew(prefill: Workload, decode: Workload) -> bool:
    """True while one role has finished rolling to the new engine revision and the other hasn't,
    or either is part-way: then some P and some D pods run different engine builds."""

    def partial(w: Workload) -> bool:
        return 0 < w.updated < w.desired

    return partial(prefill) or partial(decode)


def _role_status(w: Workload) -> dict[str, int]:
    return {"desired": w.desired, "ready": w.ready, "updated": w.updated}


def _effective_kv(dd: DisaggregatedDeployment) -> dict[str, Any]:
    kv = dd.spec.kv_transfer
    return {
        "bidirectional": kv.bidirectional,
        "recomputeThreshold": kv.recompute_threshold,
        "decoderBlocksTTLSeconds": round(parse_duration(kv.decoder_blocks_ttl)),
        "leaseDurationSeconds": round(parse_duration(kv.lease_duration)),
        "routerConversationTTLSeconds": round(dd.spec.router_ttl_seconds),
        "backend": dd.spec.backend,
        "loadFailurePolicy": kv.load_failure_policy,
    }


def _condition(
    kind: str,
    value: bool,
    reason: str,
    message: str,
    old: Mapping[str, Any] | None,
    now: str,
    generation: int,
) -> dict[str, Any]:
    status = "True" if value else "False"
    since = old["lastTransitionTime"] if old and old.get("status") == status else now
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def condition_changes(
    previous: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> Sequence[tuple[str, str, str]]:
    """(type, status, reason) of conditions whose status or reason changed: worth an event."""
    old = {c["type"]: c for c in (previous or {}).get("conditions", [])}
    changes = []
    for cond in current.get("conditions", []):
        before = old.get(cond["type"])
        if not before or (before["status"], before["reason"]) != (cond["status"], cond["reason"]):
            changes.append((cond["type"], cond["status"], cond["reason"]))
    return changes
