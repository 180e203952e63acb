"""Per-role scaling through `DisaggregatedRoleScaler` objects (scaler_api.py).

A role with `replicasFrom: Scaler` takes its replica count from its scaler, so that replicas
have exactly one owner: whoever writes the scaler's scale subresource (`kubectl scale`, an HPA,
KEDA). The operator
- creates the scaler once when it is missing, owned by the deployment (garbage-collected with
  it) and seeded from the live StatefulSet's replicas (a deleted scaler never resizes the role)
  or else from `spec.<role>.replicas`; it never writes the scaler's spec afterwards, so it
  never fights an autoscaler;
- renders the role's StatefulSet from the scaler's `spec.replicas` (`effective`): every other
  decision (rollout hold, status) reads the same resolved deployment;
- writes the scaler's status: the StatefulSet's pods and the role's label selector.
Roles with `replicasFrom: Spec` (the default) behave exactly as before: no scaler is read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from boomerang.facts.engine import ROLES, Role
from boomerang.operator import render, scaler_api
from boomerang.operator.api import API_VERSION, DisaggregatedDeployment
from boomerang.operator.kube import KubeAPI, KubeError

log = logging.getLogger(__name__)


def scaled_roles(dd: DisaggregatedDeployment) -> list[Role]:
    """The roles whose replica count a scaler owns."""
    return [role for role in ROLES if render.role_spec(dd, role).replicas_from == "Scaler"]


def scaler_name(dd: DisaggregatedDeployment, role: Role) -> str:
    """`<name>-<role>`: the same name as the role's StatefulSet."""
    return render.child_name(dd, role)


def selector(dd: DisaggregatedDeployment, role: Role) -> str:
    """The label selector of one role's pods, as the scale subresource reports it."""
    return ",".join(f"{k}={v}" for k, v in sorted(render.selector_labels(dd, role).items()))


def build_scaler(dd: DisaggregatedDeployment, role: Role, replicas: int) -> dict[str, Any]:
    """A new scaler for `role`, owned by `dd` when it has a uid."""
    meta: dict[str, Any] = {
        "name": scaler_name(dd, role),
        "namespace": dd.namespace,
        "labels": render.labels(dd, role),
    }
    uid = dd.metadata.get("uid")
    if uid:
        meta["ownerReferences"] = [
            {"apiVersion": API_VERSION, "kind": "DisaggregatedDeployment", "name": dd.name,
             "uid": str(uid), "controller": True, "blockOwnerDeletion": True}
        ]  # fmt: skip
    return {
        "apiVersion": API_VERSION,
        "kind": scaler_api.KIND,
        "metadata": meta,
        "spec": {"deploymentName": dd.name, "role": role, "replicas": replicas},
    }


def seed_replicas(dd: DisaggregatedDeployment, role: Role, live: Mapping[str, Any] | None) -> int:
    """A new scaler starts where the role is: the live StatefulSet's replicas, else the spec's."""
    current = int(((live or {}).get("spec") or {}).get("replicas") or 0)
    return current if current >= 1 else render.role_spec(dd, role).replicas


def scaler_replicas(obj: Mapping[str, Any] | None) -> int | None:
    """A live scaler's `spec.replicas` (None: no usable scaler)."""
    value = ((obj or {}).get("spec") or {}).get("replicas")
    return int(value) if isinstance(value, int) and value >= 1 else None


def resolve(
    dd: DisaggregatedDeployment,
    kube: KubeAPI,
    live: Mapping[str, Mapping[str, Any] | None],
    *,
    create: bool,
) -> dict[Role, int]:
    """The replica count of each scaled role, read from its scaler.

    A full reconcile (`create`) creates a missing scaler first; a status refresh only reads.
    A role whose scaler cannot be read or made keeps its live StatefulSet's count (or the
    spec's), so a failing scaler never resizes a role.
    """
    found: dict[Role, int] = {}
    for role in scaled_roles(dd):
        name = scaler_name(dd, role)
        try:
            obj = kube.get(API_VERSION, scaler_api.KIND, dd.namespace, name)
            if obj is None and create:
                obj = kube.apply(build_scaler(dd, role, seed_replicas(dd, role, live.get(role))))
                log.info("Created %s name=%s", scaler_api.KIND, name)
        except KubeError as exc:
            log.warning("Failed to read %s name=%s reason=%s", scaler_api.KIND, name, exc.reason)
            obj = None
        replicas = scaler_replicas(obj)
        found[role] = replicas if replicas is not None else seed_replicas(dd, role, live.get(role))
    return found


def effective(dd: DisaggregatedDeployment, replicas: Mapping[Role, int]) -> DisaggregatedDeployment:
    """`dd` with each scaled role's `replicas` replaced by its scaler's: what the builders,
    the rollout hold and status all read, so a scale changes nothing else (no pod rolls)."""
    if not replicas:
        return dd
    updates: dict[str, Any] = {
        role: render.role_spec(dd, role).model_copy(update={"replicas": count})
        for role, count in replicas.items()
    }
    return dd.model_copy(update={"spec": dd.spec.model_copy(update=updates)})


def scaler_status(
    dd: DisaggregatedDeployment,
    role: Role,
    sts: Mapping[str, Any] | None,
    scaler: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The status of one role's scaler, from its StatefulSet."""
    status = (sts or {}).get("status") or {}
    return {
        "replicas": int(status.get("replicas") or 0),
        "readyReplicas": int(status.get("readyReplicas") or 0),
        "selector": selector(dd, role),
        "observedGeneration": int(((scaler or {}).get("metadata") or {}).get("generation") or 0),
    }


def write_status(
    dd: DisaggregatedDeployment,
    kube: KubeAPI,
    observed: Mapping[str, Mapping[str, Any] | None],
) -> None:
    """Bring each scaled role's scaler status up to date (written only when it changed)."""
    for role in scaled_roles(dd):
        name = scaler_name(dd, role)
        try:
            scaler = kube.get(API_VERSION, scaler_api.KIND, dd.namespace, name)
            if scaler is None:
                continue
            status = scaler_status(dd, role, observed.get(role), scaler)
            if scaler.get("status") == status:
                continue
            kube.apply_status(
                {"apiVersion": API_VERSION, "kind": scaler_api.KIND,
                 "metadata": {"name": name, "namespace": dd.namespace}, "status": status}
            )  # fmt: skip
        except KubeError as exc:
            log.warning("Failed to write %s status name=%s reason=%s", scaler_api.KIND, name,
                        exc.reason)  # fmt: skip


def status_fields(dd: DisaggregatedDeployment) -> dict[Role, str]:
    """`status.<role>.scaler` of each scaled role: which scaler its `desired` comes from."""
    return {role: f"{scaler_api.KIND}/{scaler_name(dd, role)}" for role in scaled_roles(dd)}


def owner_of(scaler: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, deployment) of a scaler whose spec changed since its status was written:
    a scale to apply to the role's StatefulSet now. None when nothing is to do."""
    meta = scaler.get("metadata") or {}
    spec, status = scaler.get("spec") or {}, scaler.get("status") or {}
    if meta.get("deletionTimestamp") or not spec.get("deploymentName"):
        return None
    if int(meta.get("generation") or 0) == int(status.get("observedGeneration") or -1):
        return None
    return str(meta.get("namespace") or "default"), str(spec["deploymentName"])
