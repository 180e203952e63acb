"""The kopf wiring: which events call the reconciler. Everything it calls is plain code.

- the resource itself (create, update, resume) and a repair timer: full `reconcile()`;
- its StatefulSets and Deployment changing (pods becoming ready, rollouts): `refresh_status()`,
  which also releases decode's held rollout the moment prefill's has finished (rollout.py);
- any child (of a kind in `children.CHILD_KINDS`) deleted, or edited by someone else: full
  `reconcile()` of its owner, so drift is repaired at once rather than at the next timer tick;
- its pods (the StatefulSets' and the Deployment's, labelled with the resource's name; the API
  server filters the watch by that label) changing while not ready: `refresh_status()`, so a pod
  that cannot be scheduled, pulled or started shows in status within seconds (pods.py); a pod
  becoming ready changes its workload's status, which refreshes status already;
- an Adaptive resource (`kvTransfer.tuning.mode`), on a timer: its router's learned state goes
  to status (routerstate.py);
- the resource deleted: it leaves the operator's metrics (metrics.py), which count every full
  reconcile and each resource's Ready state.
Status is computed and written under a per-resource lock from fresh reads (see reconcile.py).
Progress and diff-base live in annotations, and handlers return nothing, so the status
subresource holds only the fields the CRD declares.
"""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from boomerang import facts
from boomerang.operator import api, metrics, reconcile, render, routerstate, scaler_api, scaling
from boomerang.operator.children import CHILD_KINDS
from boomerang.operator.kube import Kube

log = logging.getLogger(__name__)
REPAIR_INTERVAL_S = 60.0
_MANAGED = {"app.kubernetes.io/managed-by": render.MANAGER}
_kube: Kube | None = None
_gate = reconcile.StatusGate()
METRICS = metrics.OperatorMetrics()
_poller = routerstate.Poller()


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube()
    return _kube


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _post(body: Mapping[str, Any], outcome: reconcile.Outcome) -> None:
    for kind, reason, message in outcome.events:
        post = kopf.warn if kind == "Warning" else kopf.info
        post(body, reason=reason, message=message)  # type: ignore[arg-type]


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=api.GROUP)
    # Only warnings from kopf itself become events; our own events are posted explicitly.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.execution.max_workers = 16
    # Server-side filter: only the pods of our resources reach the operator, not the cluster's.
    settings.watching.label_selectors["", "v1", "pods"] = render.LABEL_DEPLOYMENT


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL)
@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=REPAIR_INTERVAL_S, idle=10)
def reconcile_resource(body: kopf.Body, **_: Any) -> None:
    if body.metadata.get("deletionTimestamp"):
        return
    _post(body, _reconcile(body))


def _reconcile(body: Mapping[str, Any]) -> reconcile.Outcome:
    """One full reconcile, counted in the operator's metrics."""
    key = metrics.key_of(body)
    run = functools.partial(reconcile.reconcile, body, kube(), _now(), _gate)
    return METRICS.reconciled(key, run, lambda: _gate.errors.get(key))


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
def on_resource_event(event: kopf.RawEvent, **_: Any) -> None:
    if event["type"] == "DELETED":
        key = metrics.key_of(event["object"])
        METRICS.forget(key)
        _gate.learned.pop(key, None)
        _poller.forget(key)


def _adaptive(spec: kopf.Spec, **_: Any) -> bool:
    tuning = (spec.get("kvTransfer") or {}).get("tuning") or {}
    mode = tuning.get("mode", api.TuningSpec.model_fields["mode"].default)
    return bool(mode == facts.spec_mode("adaptive"))


@kopf.timer(
    api.GROUP, api.VERSION, api.PLURAL, interval=routerstate.POLL_INTERVAL_S, when=_adaptive
)
async def poll_router_state(body: kopf.Body, **_: Any) -> None:
    """Adaptive tuning: what the router learned goes to status (routerstate.py)."""
    if body.metadata.get("deletionTimestamp"):
        return
    outcome = await _poller.poll(body, kube(), _now, _gate)
    if outcome is not None:
        METRICS.observe_status(metrics.key_of(body), outcome.status)
        _post(body, outcome)


def _owner(namespace: str, labels: Mapping[str, str]) -> dict[str, Any] | None:
    name = labels.get(render.LABEL_DEPLOYMENT)
    if not name:
        return None
    owner: dict[str, Any] | None = kube().get(api.API_VERSION, api.KIND, namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return None
    return owner


def on_child_event(event: kopf.RawEvent, **_: Any) -> None:
    """A child was deleted or edited by someone else: converge now. A workload's own progress
    (pods becoming ready, rollouts) only refreshes status."""
    obj = event["object"]
    kind, meta = obj.get("kind"), obj.get("metadata", {})
    drifted = event["type"] == "DELETED" or (
        event["type"] == "MODIFIED" and reconcile.edited_by_others(obj)
    )
    workload = kind in ("StatefulSet", "Deployment")
    if not drifted and not workload:
        return
    owner = _owner(meta.get("namespace", ""), meta.get("labels") or {})
    if owner is None:
        return
    if drifted:
        outcome = _reconcile(owner)
    else:
        outcome = reconcile.refresh_status(owner, kube(), _now(), _gate)
        METRICS.observe_status(metrics.key_of(owner), outcome.status)
    _post(owner, outcome)


@kopf.on.event(api.GROUP, api.VERSION, scaler_api.PLURAL)
def on_scaler_event(event: kopf.RawEvent, **_: Any) -> None:
    """A role's scaler was scaled (`kubectl scale`, an HPA, KEDA) or deleted: converge its
    deployment now, which resizes the role's StatefulSet or recreates the scaler."""
    obj = event["object"]
    if event["type"] == "DELETED":
        spec, meta = obj.get("spec") or {}, obj.get("metadata") or {}
        found = (str(meta.get("namespace") or "default"), str(spec.get("deploymentName") or ""))
    else:
        found = scaling.owner_of(obj) or ("", "")
    owner = _owner(found[0], {render.LABEL_DEPLOYMENT: found[1]}) if found[1] else None
    if owner is not None:
        _post(owner, _reconcile(owner))


@kopf.on.event("", "v1", "pods", labels={render.LABEL_DEPLOYMENT: kopf.PRESENT})
def on_pod_event(event: kopf.RawEvent, **_: Any) -> None:
    """A pod not ready changed (scheduled, pulling, crashing): say why in status."""
    obj = event["object"]
    if event["type"] not in ("ADDED", "MODIFIED") or _pod_ready(obj):
        return  # kopf's initial listing (resume refreshes), deletions, readiness: workloads'
    meta = obj.get("metadata", {})
    owner = _owner(meta.get("namespace", ""), meta.get("labels") or {})
    if owner is None:
        return
    outcome = reconcile.refresh_status(owner, kube(), _now(), _gate)
    METRICS.observe_status(metrics.key_of(owner), outcome.status)
    _post(owner, outcome)


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


for _kind in CHILD_KINDS:
    kopf.on.event(_kind.group, _kind.version, _kind.plural, labels=_MANAGED)(on_child_event)
