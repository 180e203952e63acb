"""Compute the resource's status from what its workloads report: a pure function.

Status is written on purpose, for people and for tools (`kubectl get`, Argo CD health checks):
per-role desired/ready/updated counts, the router's readiness and URL, the effective kv-transfer
settings, whether P and D run different engine revisions, and three standard conditions (plus
kstatus' Reconciling and Stalled, mirroring Progressing and Degraded, for Flux and other kstatus
readers). It is built from the status model in `api/status.py`, so it holds exactly the fields
the CRD declares, under the names the CRD declares:
- Ready: every role and the router have all their replicas ready at the current generation;
- Progressing: a rollout or scale is under way (including P and D at different revisions);
  its message says when decode's pods wait for prefill to roll out first (rollout.py);
- Degraded: something that will not fix itself, most specific first: the last reconcile
  failed; no node can hold a role's pod (preflight.py: InsufficientCapacity); a component's
  pods cannot be scheduled, pulled or kept running (pods.py: Unschedulable, ImagePullFailed,
  EFAMemoryRegistrationFailed, OOMKilled, CrashLoopBackOff); no progress for
  PROGRESS_DEADLINE_S (ProgressDeadlineExceeded); replicas went missing after the current spec
  was Ready, with no rollout to explain it.
A condition's `lastTransitionTime` moves only when its status changes, so status never flaps;
Progressing's (and Reconciling's) also restarts when a new generation is seen or a replica
becomes ready or updated: it is the progress deadline's clock, like a Deployment's
`lastUpdateTime`, so a long rollout that keeps moving never exceeds it.

`revisionSkew` compares the engine revisions the pods of both roles run (revisions.py).
`kvTransfer` carries, for Adaptive tuning, what the router has learned (tuning.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from boomerang.facts.engine import ROLES
from boomerang.operator import engines, render, revisions, rollout, scaling, tuning
from boomerang.operator.api import (
    Condition,
    DisaggregatedDeployment,
    DisaggregatedDeploymentStatus,
    EffectiveKVTransfer,
    RoleStatus,
    RouterStatus,
)
from boomerang.operator.pods import PRIORITY, Finding

PROGRESS_DEADLINE_S = float(engines.STARTUP_BUDGET_S)
"""Progressing this long without a replica becoming ready or updated is Degraded, as a
Deployment's progressDeadlineSeconds: one engine's whole startup budget (operator-wide; the API
has no field for it)."""


@dataclass(frozen=True)
class Diagnosis:
    """Why components are not ready, read apart from their workloads' counts."""

    pods: Mapping[str, Finding] = field(default_factory=dict)
    """prefill/decode/router: the most specific finding on its pods (pods.py)."""
    capacity: Mapping[str, str] = field(default_factory=dict)
    """prefill/decode: why no node can hold one of its pods (preflight.py)."""


@dataclass(frozen=True)
class Workload:
    """The rollout state of one StatefulSet or Deployment, read from its status."""

    desired: int
    ready: int
    updated: int
    settled: bool  # controller caught up with the spec and no revision change pending
    held: bool = False  # a pending revision change the StatefulSet's partition holds back
    revisions: frozenset[str] = frozenset()  # engine revisions its pods run (engine roles)

    @property
    def complete(self) -> bool:
        return self.settled and self.ready >= self.desired and self.updated >= self.desired


def workload(
    obj: Mapping[str, Any] | None,
    desired: int,
    pods: Sequence[Mapping[str, Any]] | None = None,
) -> Workload:
    """Read a StatefulSet's or Deployment's status (None: not created yet); `pods`: its pods,
    where they were read."""
    if not obj:
        return Workload(desired=desired, ready=0, updated=0, settled=False)
    status = obj.get("status") or {}
    generation = obj.get("metadata", {}).get("generation", 0)
    settled = status.get("observedGeneration", 0) >= generation
    held = False
    running: frozenset[str] = frozenset()
    if obj.get("kind") == "StatefulSet":
        current, update = status.get("currentRevision"), status.get("updateRevision")
        settled = settled and (current == update or desired == 0)
        held = not settled and rollout.partition(obj) > 0
        running = revisions.running(obj, pods)
    return Workload(
        desired=desired,
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        settled=settled,
        held=held,
        revisions=running,
    )


def compute_status(
    dd: DisaggregatedDeployment,
    observed: Mapping[str, Mapping[str, Any] | None],
    previous: Mapping[str, Any] | None,
    now: str,
    error: str | None = None,
    diagnosis: Diagnosis | None = None,
    deadline_s: float = PROGRESS_DEADLINE_S,
    pods: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    learned: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole `.status` object; `observed` maps prefill/decode/router to their workloads,
    `pods` the components whose pods were read (at least each engine role mid-rollout),
    `learned` what the router reports it has learned (tuning.in_force; Adaptive only)."""
    generation = int(dd.metadata.get("generation") or 0)
    roles: dict[str, Workload] = {
        role: workload(
            observed.get(role), render.role_spec(dd, role).replicas, (pods or {}).get(role)
        )
        for role in ROLES
    }
    router = workload(observed.get("router"), dd.spec.router.replicas)
    skew = revisions.skewed(roles["prefill"].revisions, roles["decode"].revisions)
    status = DisaggregatedDeploymentStatus(
        observed_generation=generation,
        prefill=_role_status(roles["prefill"]),
        decode=_role_status(roles["decode"]),
        router=RouterStatus(desired=router.desired, ready=router.ready, url=render.router_url(dd)),
        kv_transfer=_effective_kv(dd, learned),
        engine_revision=render.engine_revision(dd),
        revision_skew=skew,
    )
    for role, scaler in scaling.status_fields(dd).items():  # replicasFrom: Scaler
        role_status = getattr(status, role).model_copy(update={"scaler": scaler})
        status = status.model_copy(update={role: role_status})
    counts = status.model_dump(by_alias=True, include={"prefill", "decode", "router"})
    old = {c["type"]: c for c in (previous or {}).get("conditions", [])}
    # Ready once for this very spec: replicas missing since then are a fault. After a spec
    # change (a scale-up first seen with its new pods pending) they are the change under way.
    # Remembered as a generation, not read from the last Ready condition: a transient status
    # in between (pods deleted, the StatefulSet not yet caught up) would otherwise make a
    # resource that lost its pods look like one still rolling out, forever.
    # A role's scaler (scaling.py) grows it at the same generation: its new pods are the change
    # under way, not missing ones, until everything is ready again.
    grew = _grew({r: roles[r] for r in scaling.scaled_roles(dd)}, previous)
    was_ready = _ready_generation(previous) == generation and not grew
    since = _progress_since(old.get("Progressing"), counts, previous, now, generation)
    overdue = _elapsed(since, now) > deadline_s
    facts = _Facts(error, was_ready, diagnosis or Diagnosis(), overdue, deadline_s)
    decided = _decide(roles, router, skew, facts)
    ready_generation = generation if decided["Ready"][0] else _ready_generation(previous)
    if grew and not decided["Ready"][0]:
        ready_generation = None
    conditions = []
    for kind, (value, reason, message) in decided.items():
        cond = _condition(kind, value, reason, message, old.get(kind), now, generation)
        if kind in _PROGRESS_CLOCKS and value:
            cond = cond.model_copy(update={"last_transition_time": since})
        conditions.append(cond)
    status = status.model_copy(
        update={"ready_generation": ready_generation, "conditions": conditions}
    )
    return status.model_dump(by_alias=True, exclude_none=True)


def invalid_status(
    generation: int, message: str, previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """What a spec the model or the builders reject changes in status: `observedGeneration` and
    the conditions, which say `InvalidSpec` (the rest still describes the workloads). A
    condition keeps its `lastTransitionTime` while its status stays, so an unchanged invalid
    spec computes an unchanged status."""
    old = {c["type"]: c for c in (previous or {}).get("conditions", [])}
    faulty = {"Degraded", "Stalled"}
    conditions = [
        _condition(kind, kind in faulty, "InvalidSpec", message, old.get(kind), now, generation)
        for kind in ("Ready", "Progressing", "Degraded", "Reconciling", "Stalled")
    ]
    status = DisaggregatedDeploymentStatus(observed_generation=generation, conditions=conditions)
    return status.model_dump(by_alias=True, exclude_unset=True)


_PROGRESS_CLOCKS = frozenset({"Progressing", "Reconciling"})


def _progress_since(
    old: Mapping[str, Any] | None,
    counts: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    now: str,
    generation: int,
) -> str:
    """When the current progress began: the last time Progressing turned True, a new
    generation was seen, or a replica became ready or updated."""
    if not old or old.get("status") != "True" or old.get("observedGeneration") != generation:
        return now
    for component in (*ROLES, "router"):
        before, after = (previous or {}).get(component) or {}, counts[component]
        for count in ("ready", "updated"):
            if count in after and int(after[count]) > int(before.get(count) or 0):
                return now
    return str(old.get("lastTransitionTime") or now)


def _elapsed(since: str, now: str) -> float:
    try:
        start, end = datetime.datetime.fromisoformat(since), datetime.datetime.fromisoformat(now)
    except ValueError:
        return 0.0
    return (end - start).total_seconds()


def _grew(roles: Mapping[str, Workload], previous: Mapping[str, Any] | None) -> bool:
    """A scaled role asks for more replicas than the last status said."""
    for role, w in roles.items():
        before = ((previous or {}).get(role) or {}).get("desired")
        if isinstance(before, int) and w.desired > before:
            return True
    return False


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


@dataclass(frozen=True)
class _Facts:
    """What status knows beyond the workloads' counts."""

    error: str | None  # the last full reconcile's failure
    was_ready: bool  # every replica was ready at this generation once
    diagnosis: Diagnosis
    overdue: bool  # progressing for longer than the deadline with no replica moving
    deadline_s: float


def _decide(
    roles: Mapping[str, Workload], router: Workload, skew: bool, facts: _Facts
) -> dict[str, Decision]:
    """Ready, Progressing and Degraded, each as (status, reason, message)."""
    everything = {**roles, "router": router}
    incomplete = [name for name, w in everything.items() if not w.complete]
    waiting = [_waiting(name, everything[name], facts.diagnosis) for name in incomplete]
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
    degraded = _degraded(incomplete, waiting, bool(rolling), progressing[0], facts)
    ready: Decision = (True, "AllReplicasReady", "prefill, decode and router ready")
    if facts.error is not None:
        ready = (False, "ReconcileFailed", facts.error)
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


def _waiting(name: str, w: Workload, diagnosis: Diagnosis) -> str:
    """`decode 0/1 ready`, with why when that may pass on its own (a stuck reason is
    Degraded's message)."""
    finding = diagnosis.pods.get(name)
    detail = f" ({finding.message})" if finding and not finding.stuck else ""
    return f"{name} {w.ready}/{w.desired} ready{detail}"


def _degraded(
    incomplete: Sequence[str],
    waiting: Sequence[str],
    rolling: bool,
    progressing: bool,
    facts: _Facts,
) -> Decision:
    """Degraded, most specific first; pods and capacity count only for components not ready."""
    if facts.error is not None:
        return (True, "ReconcileFailed", facts.error)
    short = [facts.diagnosis.capacity[n] for n in incomplete if n in facts.diagnosis.capacity]
    if short:
        return (True, "InsufficientCapacity", "; ".join(short))
    stuck = [
        (f := facts.diagnosis.pods[n], f"{n}: {f.message}")
        for n in incomplete
        if n in facts.diagnosis.pods and facts.diagnosis.pods[n].stuck
    ]
    if stuck:
        first = min(stuck, key=lambda s: PRIORITY.index(s[0].reason))[0]
        return (True, first.reason, "; ".join(message for _, message in stuck))
    if progressing and facts.overdue:
        minutes = round(facts.deadline_s / 60)
        message = f"no replica became ready or updated in {minutes}m: "
        message += "; ".join(waiting) or "rollout not finished"
        return (True, "ProgressDeadlineExceeded", message)
    if facts.was_ready and waiting and not rolling:
        # Replicas were all ready and went away with no rollout to explain it.
        return (True, "ReplicasUnavailable", "; ".join(waiting))
    return (False, "AsExpected", "no faults")


def _role_status(w: Workload) -> RoleStatus:
    return RoleStatus(desired=w.desired, ready=w.ready, updated=w.updated)


def _effective_kv(
    dd: DisaggregatedDeployment, learned: Mapping[str, Any] | None
) -> EffectiveKVTransfer:
    kv = dd.spec.kv_transfer
    found = dict(learned or {}) if tuning.adaptive(dd) else {}
    return EffectiveKVTransfer(
        **found,
        mode=kv.tuning.mode,
        bidirectional=kv.bidirectional,
        recompute_threshold=kv.recompute_threshold,
        decoder_blocks_ttl_seconds=kv.decoder_blocks_ttl_s,
        lease_duration_seconds=kv.lease_duration_s,
        router_conversation_ttl_seconds=round(dd.spec.router_ttl_seconds),
        backend=dd.spec.backend,
        load_failure_policy=kv.load_failure_policy,
    )


def _condition(
    kind: str,
    value: bool,
    reason: str,
    message: str,
    old: Mapping[str, Any] | None,
    now: str,
    generation: int,
) -> Condition:
    status: Literal["True", "False"] = "True" if value else "False"
    since = old["lastTransitionTime"] if old and old.get("status") == status else now
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=str(since),
        observed_generation=generation,
    )


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
