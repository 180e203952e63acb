"""One idempotent reconcile for create, update, resume and the repair timer.

Level-based, as kopf and controller-runtime recommend: read the whole desired state, apply every
child with server-side apply (correcting any drift), then read the resource and its workloads
fresh, compute status, and write it only when it changed. Nothing here branches on
"was this a create or an update". The kopf wiring in `handlers.py` calls these functions and
emits the events they return. The one child that is not applied is the lease token's Secret:
created when missing and never rewritten (leasetoken.py), so a reconcile never rotates it.

Status also says why pods are not ready. A full reconcile compares each engine role's GPU, EFA
and hugepages request with the nodes its pods may run on (preflight.py), so a pod no node can
hold is reported from the spec at once; every refresh reads the pods of components not yet
ready (pods.py). Both are read only while something is not ready: a settled resource costs nothing.
A cluster that refuses the operator nodes (a namespaced install without that grant) skips the
preflight and says so once in the log. The pods of an engine role mid-rollout are read too: they
say which engine revisions run, for `revisionSkew` (revisions.py).

A spec the model or the builders reject is said in status (InvalidSpec) and in one Warning
event, written only when that status changes: the repair timer finds the same invalid spec
every minute and leaves both alone.

One child depends on another's state: decode's rollout waits for prefill's (rollout.py). A
reconcile reads both engine StatefulSets before applying to decide the hold; a status refresh,
which every workload event triggers, releases it as soon as prefill reports it has rolled out.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from boomerang.facts.engine import ROLES
from boomerang.operator import (
    engines,
    leasetoken,
    pods,
    preflight,
    render,
    revisions,
    rollout,
    scaling,
    tuning,
)
from boomerang.operator.api import API_VERSION, KIND, DisaggregatedDeployment
from boomerang.operator.children import desired_children
from boomerang.operator.kube import KubeAPI, KubeError
from boomerang.operator.status import (
    KSTATUS_MIRRORS,
    Diagnosis,
    compute_status,
    condition_changes,
    invalid_status,
)
from boomerang.operator.statusgate import StatusGate as StatusGate

log = logging.getLogger(__name__)

Event = tuple[str, str, str]  # (Normal|Warning, reason, message)
_MESSAGE_MAX = 1000
"""Failure messages in conditions are cut to this, to stay readable in `kubectl describe`."""


@dataclass
class Outcome:
    """What a reconcile did: the status it computed and the events worth posting."""

    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    written: bool = False
    invalid: bool = False
    """The spec is rejected by the model or the builders (status says InvalidSpec)."""


def reconcile(
    body: Mapping[str, Any], kube: KubeAPI, now: str, gate: StatusGate | None = None
) -> Outcome:
    """Converge every child of one resource, then write its status from fresh reads.

    The engine StatefulSets are read first: decode's pods are held while prefill rolls out.
    """
    try:
        dd = DisaggregatedDeployment.model_validate(dict(body))
        prefill, decode = _read_engine(dd, kube, "prefill"), _read_engine(dd, kube, "decode")
        live = {"prefill": prefill, "decode": decode}
        dd = scaling.effective(dd, scaling.resolve(dd, kube, live, create=True))  # scalers' counts
        # The builders validate too (the router's own config): a spec they refuse is invalid.
        children = desired_children(dd, decode_held=rollout.decode_held(dd, prefill, decode))
    except ValidationError as exc:
        return _invalid(body, kube, now, exc)
    try:
        error = _converge(dd, kube, children)
    except _Terminating:
        log.info("Skipped reconcile name=%s reason=namespace terminating", dd.name)
        return Outcome(status=dict(body.get("status") or {}))
    capacity = _preflight(dd, kube, children, {"prefill": prefill, "decode": decode})
    return refresh_status(body, kube, now, gate, error=error, capacity=capacity, full=True)


class _Terminating(Exception):
    """The namespace is being deleted: nothing is left to converge."""


def _converge(
    dd: DisaggregatedDeployment, kube: KubeAPI, children: list[dict[str, Any]]
) -> str | None:
    """Create the lease token's Secret when missing (before the pods that read it; it is never
    applied again), then apply every child: what failed, as one message (None: nothing)."""
    unmade = None
    try:
        leasetoken.ensure(dd, kube)
    except KubeError as exc:
        if _namespace_terminating(exc):
            raise _Terminating from exc
        secret = render.lease_token_secret(dd)
        log.warning("Failed to create Secret name=%s reason=%s", secret, exc.reason)
        unmade = f"Secret {secret} not created: {exc.reason}"
    failed: dict[str, str] = {}
    for obj in children:
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            kube.apply(obj)
        except KubeError as exc:
            if _namespace_terminating(exc):
                raise _Terminating from exc
            log.warning("Failed to apply %s name=%s reason=%s", kind, name, exc.reason)
            failed[f"{kind} {name}"] = exc.reason
    errors = [e for e in (unmade, _apply_error(failed, children)) if e]
    return "; ".join(errors)[:_MESSAGE_MAX] if errors else None


def _preflight(
    dd: DisaggregatedDeployment,
    kube: KubeAPI,
    children: list[dict[str, Any]],
    live: Mapping[str, Mapping[str, Any] | None],
) -> dict[str, str]:
    """Per engine role not yet rolled out: why no node can hold one of its pods."""
    found: dict[str, str] = {}
    for role in ROLES:
        if rollout.rolled_out(live[role], engines.config_hash(dd, role)):
            continue  # its pods run: the nodes hold them
        name = render.child_name(dd, role)
        sts = next(
            o for o in children if o["kind"] == "StatefulSet" and o["metadata"]["name"] == name
        )
        pod_spec = sts["spec"]["template"]["spec"]
        if not preflight.pod_requests(pod_spec):
            continue
        try:
            nodes = kube.list_objects("v1", "Node", None, pod_spec.get("nodeSelector") or {})
        except KubeError as exc:
            _skip_preflight(exc)
            return {}
        message = preflight.shortfall(role, pod_spec, nodes)
        if message is not None:
            found[role] = message
    return found


_preflight_refused = threading.Event()


def _skip_preflight(exc: KubeError) -> None:
    if exc.status == 403:
        if not _preflight_refused.is_set():
            _preflight_refused.set()
            log.warning("Skipped preflight reason=cannot list nodes (grant nodes list): %s", exc)
    else:
        log.warning("Skipped preflight reason=%s", exc.reason)


def _apply_error(failed: Mapping[str, str], children: list[dict[str, Any]]) -> str | None:
    """Every child not applied, by name: the others were, so the set is only half there.

    Names come before reasons, so a message cut to length still says which children are missing.
    """
    if not failed:
        return None
    reasons = "; ".join(f"{child}: {reason}" for child, reason in failed.items())
    message = (
        f"{len(failed)} of {len(children)} children not applied: {', '.join(failed)} ({reasons})"
    )
    return message[:_MESSAGE_MAX]


def refresh_status(
    body: Mapping[str, Any],
    kube: KubeAPI,
    now: str,
    gate: StatusGate | None = None,
    *,
    error: str | None = None,
    capacity: Mapping[str, str] | None = None,
    full: bool = False,
    learned: Mapping[str, Any] | None = None,
) -> Outcome:
    """Recompute status from fresh reads of the resource and its workloads, and write it.

    Reads and the write happen under the resource's lock, so concurrent handlers (a reconcile
    and a workload event) cannot land a status computed from older reads after a newer one.
    A full reconcile records its own `error` (None clears a past failure) and preflight
    `capacity`; an event-driven refresh shows the last reconcile's. `learned` is what the
    router reported it learned (routerstate.py), kept until its next report.
    """
    meta = body.get("metadata", {})
    key = (str(meta.get("namespace") or "default"), str(meta.get("name")))
    gate = gate or StatusGate()
    if full:
        gate.errors[key] = error
        gate.capacity[key] = dict(capacity or {})
    if learned is not None:
        gate.learned[key] = dict(learned)
    outcome = gate.run_once(key, lambda: _refresh(key, kube, now, gate))
    return outcome or Outcome(status={})


def _refresh(key: tuple[str, str], kube: KubeAPI, now: str, gate: StatusGate) -> Outcome:
    namespace, name = key
    owner = kube.get(API_VERSION, KIND, namespace, name)
    if owner is None or owner.get("metadata", {}).get("deletionTimestamp"):
        return Outcome(status={})
    try:
        dd = DisaggregatedDeployment.model_validate(owner)
    except ValidationError:  # the full reconcile reports it (InvalidSpec); keep what it wrote
        return Outcome(status=dict(owner.get("status") or {}))
    previous = owner.get("status") or {}
    observed: dict[str, Mapping[str, Any] | None] = {
        role: _read_engine(dd, kube, role) for role in ROLES
    }
    observed["router"] = kube.get(
        "apps/v1", "Deployment", dd.namespace, render.child_name(dd, "router")
    )
    dd = scaling.effective(dd, scaling.resolve(dd, kube, observed, create=False))
    scaling.write_status(dd, kube, observed)
    if rollout.release_due(dd, observed["prefill"], observed["decode"]):
        observed["decode"] = _release_decode(dd, kube) or observed["decode"]
    # The last full reconcile's result; after a restart, what the status last said.
    error = gate.errors[key] if key in gate.errors else _last_error(previous)
    capacity = gate.capacity[key] if key in gate.capacity else _last_capacity(previous)
    listed = _read_pods(dd, kube, observed)
    findings = {c: pods.diagnose(listed[c]) for c in _not_ready(observed) if c in listed}
    found = {c: finding for c, finding in findings.items() if finding is not None}
    diagnosis = Diagnosis(pods=found, capacity=capacity)
    if not tuning.adaptive(dd):
        gate.learned.pop(key, None)  # a later switch to Adaptive waits for a fresh report
    learned = tuning.in_force(previous, gate.learned.get(key), now)
    return _finish(dd, observed, previous, kube, now, error, diagnosis, listed, learned)


def _not_ready(observed: Mapping[str, Mapping[str, Any] | None]) -> set[str]:
    """Components that exist with fewer ready replicas than they want."""
    found = set()
    for component, obj in observed.items():
        status = (obj or {}).get("status") or {}
        desired = int((obj or {}).get("spec", {}).get("replicas") or 0)
        if obj is not None and int(status.get("readyReplicas") or 0) < desired:
            found.add(component)
    return found


def _read_pods(
    dd: DisaggregatedDeployment, kube: KubeAPI, observed: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, list[dict[str, Any]]]:
    """The pods of each component not fully ready (why not) and of each engine role mid-rollout
    (which engine revisions run): one list call per component, none for a settled one."""
    wanted = _not_ready(observed) | {
        role for role in ROLES if (obj := observed.get(role)) and not revisions.at_one_revision(obj)
    }
    found: dict[str, list[dict[str, Any]]] = {}
    for component in sorted(wanted):
        try:
            found[component] = kube.list_objects(
                "v1", "Pod", dd.namespace, render.selector_labels(dd, component)
            )
        except KubeError as exc:
            log.warning("Failed to list pods role=%s reason=%s", component, exc.reason)
    return found


def _read_engine(dd: DisaggregatedDeployment, kube: KubeAPI, role: str) -> Mapping[str, Any] | None:
    return kube.get("apps/v1", "StatefulSet", dd.namespace, render.child_name(dd, role))


def _release_decode(dd: DisaggregatedDeployment, kube: KubeAPI) -> Mapping[str, Any] | None:
    """Prefill has rolled out: lower decode's partition now, not at the next full reconcile.

    Applies the whole decode StatefulSet as a reconcile would (server-side apply drops any field
    left out), which `release_due` has checked differs from the live one only in its partition.
    """
    decode = render.child_name(dd, "decode")
    desired = next(
        o
        for o in desired_children(dd)
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] == decode
    )
    try:
        released = kube.apply(desired)
    except KubeError as exc:
        log.warning("Failed to release StatefulSet name=%s reason=%s", decode, exc.reason)
        return None
    log.info("Released StatefulSet name=%s role=decode reason=prefill rolled out", decode)
    return released


def _namespace_terminating(exc: KubeError) -> bool:
    return exc.status == 403 and "being terminated" in exc.reason


# The controller-manager writes metadata of its own on our children (a Deployment's revision
# annotation) and never a field we set: its writes are not drift.
_OWN_OR_CONTROLLERS = {render.MANAGER, "kube-controller-manager"}


def edited_by_others(obj: Mapping[str, Any]) -> bool:
    """True when the newest change to a child's spec was made by someone other than us.

    Server-side apply records who last touched each object; status writes by controllers are
    recorded per subresource and ignored here. Our own no-op applies record nothing, so
    repairing an edit ends the chain of events.
    """
    entries = [
        e for e in obj.get("metadata", {}).get("managedFields") or [] if not e.get("subresource")
    ]
    if not entries:
        return False
    newest = max(entries, key=lambda e: str(e.get("time", "")))
    return bool(newest.get("manager") not in _OWN_OR_CONTROLLERS)


def _last_error(previous: Mapping[str, Any]) -> str | None:
    """Keep a reconcile failure visible until the next full reconcile clears it."""
    for cond in previous.get("conditions", []):
        if cond["type"] == "Degraded" and cond.get("reason") == "ReconcileFailed":
            return str(cond.get("message"))
    return None


def _last_capacity(previous: Mapping[str, Any]) -> dict[str, str]:
    """Keep a preflight shortfall visible until the next full reconcile checks again."""
    for cond in previous.get("conditions", []):
        if cond["type"] == "Degraded" and cond.get("reason") == "InsufficientCapacity":
            parts = re.split(r"; (?=(?:prefill|decode) needs )", str(cond.get("message")))
            return {role: p for p in parts for role in ROLES if p.startswith(f"{role} ")}
    return {}


def _finish(
    dd: DisaggregatedDeployment,
    observed: Mapping[str, Mapping[str, Any] | None],
    previous: Mapping[str, Any],
    kube: KubeAPI,
    now: str,
    error: str | None,
    diagnosis: Diagnosis,
    listed: Mapping[str, list[dict[str, Any]]],
    learned: Mapping[str, Any],
) -> Outcome:
    status = compute_status(
        dd, observed, previous, now, error, diagnosis, pods=listed, learned=learned
    )
    outcome = Outcome(status=status, events=_events(previous, status))
    if status != previous:
        kube.patch_status(dd.namespace, dd.name, status)
        outcome.written = True
    return outcome


def _events(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[Event]:
    events: list[Event] = []
    for kind, value, reason in condition_changes(previous, status):
        if kind in KSTATUS_MIRRORS:
            continue  # the same change as Progressing's or Degraded's: one event is enough
        bad = (kind == "Degraded" and value == "True") or (kind == "Ready" and value == "False")
        message = next(c["message"] for c in status["conditions"] if c["type"] == kind)
        events.append(("Warning" if bad else "Normal", reason, f"{kind}={value}: {message}"))
    return events


def _located(error: Mapping[str, Any]) -> str:
    """`spec.router.conversationTTL: <why>`; a rule on the whole object names its fields itself."""
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _invalid(body: Mapping[str, Any], kube: KubeAPI, now: str, exc: ValidationError) -> Outcome:
    """A resource the API server accepted but the model or the builders reject (e.g. an older
    CRD is installed): said in status, never raised, since no retry can fix it. Written, with
    its event, only when it changes what status says."""
    meta = body.get("metadata", {})
    message = "; ".join(_located(e) for e in exc.errors())[:_MESSAGE_MAX]
    previous = body.get("status") or {}
    status = invalid_status(int(meta.get("generation") or 0), message, previous, now)
    outcome = Outcome(status={**previous, **status}, invalid=True)
    if any(previous.get(key) != value for key, value in status.items()):
        kube.patch_status(meta.get("namespace", "default"), meta.get("name", ""), status)
        outcome.events, outcome.written = [("Warning", "InvalidSpec", message)], True
    return outcome
