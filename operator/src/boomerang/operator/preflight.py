"""Preflight: can any node hold one pod of a role at all? A pure comparison with the nodes.

A pod asking for more GPUs or EFA interfaces than any node has would pend forever, and the
scheduler says so only once the pod exists. Comparing each engine role's per-pod request of
`nvidia.com/gpu` and `vpc.amazonaws.com/efa` with the allocatable of the nodes its pods may run
on (its nodeSelector matches, and it tolerates their NoSchedule/NoExecute taints) says it from
the spec, in numbers: `decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching
node offers is 16 (3 nodes match)`.

Only what is certain counts: when no node matches at all (an autoscaler may be about to add
one, or the selector is wrong) the scheduler's own Unschedulable message says it; cordoned
nodes count (they come back); affinity and other pods' usage are the scheduler's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CHECKED = ("nvidia.com/gpu", "vpc.amazonaws.com/efa")
"""Extended resources whose per-node supply is fixed by the instance type."""


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """Per-pod requests of the checked resources (a limit alone counts as the request)."""
    total: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name in CHECKED:
            if name in wanted:
                total[name] = total.get(name, 0) + _count(wanted[name])
    return {name: n for name, n in total.items() if n > 0}


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0  # extended resources are integers; anything else is not ours to judge


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' toleration matching for one taint."""
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def eligible(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """The pod's nodeSelector matches the node and it tolerates the node's hard taints."""
    labels = node.get("metadata", {}).get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    tolerations = pod_spec.get("tolerations") or []
    return all(
        tolerates(tolerations, taint)
        for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    )


def shortfall(
    role: str, pod_spec: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why no node can hold one pod of `role`, in numbers; None when one can (or none match)."""
    wanted = pod_requests(pod_spec)
    matching = [n for n in nodes if eligible(n, pod_spec)]
    if not wanted or not matching:
        return None
    for name, count in wanted.items():
        offered = [_allocatable(n, name) for n in matching]
        if max(offered) < count:
            plural = "node matches" if len(matching) == 1 else "nodes match"
            return (
                f"{role} needs {count} {name} per pod; the most any matching node offers is "
                f"{max(offered)} ({len(matching)} {plural})"
            )
    fits = [n for n in matching if all(_allocatable(n, k) >= v for k, v in wanted.items())]
    if not fits:
        asked = ", ".join(f"{v} {k}" for k, v in wanted.items())
        return f"{role} needs {asked} per pod together; no matching node offers all of them"
    return None


def _allocatable(node: Mapping[str, Any], name: str) -> int:
    return _count(((node.get("status") or {}).get("allocatable") or {}).get(name, 0))
