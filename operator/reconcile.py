"""One idempotent reconcile for create, update, resume and the repair timer.

Level-based, as kopf and controller-runtime recommend: read the whole desired state, apply every
child with server-side apply (correcting any drift), read the workloads' state back from the
apply responses, compute status, and write it only when it changed. Nothing here branches on
"was this a create or an update". The kopf wiring in `handlers.py` calls these functions and
emits the events they return.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from boomerang.connector.config import ROLES
from boomerang.operator import render
from boomerang.operator.api import DisaggregatedDeployment
from boomerang.operator.children import desired_children
from boomerang.operator.kube import KubeAPI, KubeError
from boomerang.operator.status import compute_status, condition_changes

log = logging.getLogger(__name__)

Event = tuple[str, str, str]  # (Normal|Warning, reason, message)


@dataclass
class Outcome:
    """What a reconcile did: the status it computed and the events worth posting."""

    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    written: bool = False


def _workload_component(obj: Mapping[str, Any]) -> str | None:
    if obj.get("kind") in ("StatefulSet", "Deployment"):
        return str(obj["metadata"]["labels"][render.LABEL_ROLE])
    return None


def reconcile(body: Mapping[str, Any], kube: KubeAPI, now: str) -> Outcome:
    """Converge every child of one resource and write its status."""
    previous = body.get("status") or {}
    try:
        dd = DisaggregatedDeployment.model_validate(dict(body))
    except ValidationError as exc:
        return _invalid(body, kube, now, exc)
    observed: dict[str, Mapping[str, Any] | None] = {}
    error = None
    for obj in desired_children(dd):
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            applied = kube.apply(obj)
        except KubeError as exc:
            log.warning("Failed to apply %s name=%s reason=%s", kind, name, exc.reason)
            error = error or f"applying {kind} {name}: {exc.reason}"
            continue
        component = _workload_component(obj)
        if component:
            observed[component] = applied
    return _finish(dd, observed, previous, kube, now, error)


def refresh_status(body: Mapping[str, Any], kube: KubeAPI, now: str) -> Outcome:
    """Recompute status from the workloads alone (on their events), applying nothing."""
    previous = body.get("status") or {}
    dd = DisaggregatedDeployment.model_validate(dict(body))
    observed: dict[str, Mapping[str, Any] | None] = {}
    for component in (*ROLES, "router"):
        kind = "Deployment" if component == "router" else "StatefulSet"
        name = render.child_name(dd, component)
        observed[component] = kube.get("apps/v1", kind, dd.namespace, name)
    error = _last_error(previous)
    return _finish(dd, observed, previous, kube, now, error)


def _last_error(previous: Mapping[str, Any]) -> str | None:
    """Keep a reconcile failure visible until the next full reconcile clears it."""
    for cond in previous.get("conditions", []):
        if cond["type"] == "Degraded" and cond.get("reason") == "ReconcileFailed":
            return str(cond.get("message"))
    return None


def _finish(
    dd: DisaggregatedDeployment,
    observed: Mapping[str, Mapping[str, Any] | None],
    previous: Mapping[str, Any],
    kube: KubeAPI,
    now: str,
    error: str | None,
) -> Outcome:
    status = compute_status(dd, observed, previous, now, error)
    outcome = Outcome(status=status, events=_events(previous, status))
    if status != previous:
        kube.patch_status(dd.namespace, dd.name, status)
        outcome.written = True
    return outcome


def _events(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[Event]:
    events: list[Event] = []
    for kind, value, reason in condition_changes(previous, status):
        bad = (kind == "Degraded" and value == "True") or (kind == "Ready" and value == "False")
        message = next(c["message"] for c in status["conditions"] if c["type"] == kind)
        events.append(("Warning" if bad else "Normal", reason, f"{kind}={value}: {message}"))
    return events


def _invalid(body: Mapping[str, Any], kube: KubeAPI, now: str, exc: ValidationError) -> Outcome:
    """A spec the API server accepted but the model rejects (e.g. an older CRD is installed)."""
    meta = body.get("metadata", {})
    message = "; ".join(
        f"spec.{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors()
    )[:1000]
    generation = int(meta.get("generation") or 0)
    conditions = [
        {"type": kind, "status": value, "reason": "InvalidSpec", "message": message,
         "lastTransitionTime": now, "observedGeneration": generation}
        for kind, value in (("Ready", "False"), ("Progressing", "False"), ("Degraded", "True"))
    ]  # fmt: skip
    status = {"observedGeneration": generation, "conditions": conditions}
    kube.patch_status(meta.get("namespace", "default"), meta.get("name", ""), status)
    return Outcome(status=status, events=[("Warning", "InvalidSpec", message)], written=True)
