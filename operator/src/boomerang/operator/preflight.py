"""Preflight: can any node hold one pod of a role at all? A pure comparison with the nodes.

A pod asking for more GPUs, EFA interfaces or 2 MiB hugepages than any node has would pend
forever, and the scheduler says so only once the pod exists (hugepages: only as `Insufficient
hugepages-2Mi`, which reads like a full node, when no node reserved any). Comparing each engine
role's per-pod request of `nvidia.com/gpu`, `vpc.amazonaws.com/efa` and `hugepages-2Mi` with the
allocatable of the nodes its pods may run on (its nodeSelector and required node affinity match,
and it tolerates their NoSchedule/NoExecute taints) says it from the spec, in numbers: `decode
needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is 16 (3 nodes
match)`, with what to change for hugepages, which a node reserves at boot.

Only what is certain counts: when no node matches at all (an autoscaler may be about to add
one, or the selector is wrong) the scheduler's own Unschedulable message says it; cordoned
nodes count (they come back); preferred affinity, pod affinity and other pods' usage are the
scheduler's business.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

HUGEPAGES = "hugepages-2Mi"
CHECKED = ("nvidia.com/gpu", "vpc.amazonaws.com/efa", HUGEPAGES)
"""Resources whose per-node supply is fixed by the instance type or reserved at boot."""
MIB = 2**20
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE])?$")
_FACTOR = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_FACTOR |= {f"{p}i": 2 ** (10 * (i + 1)) for i, p in enumerate("KMGTPE")}
HUGEPAGES_HINT = (
    "reserve 2 MiB hugepages on the nodes (e.g. vm.nr_hugepages in their launch template; the "
    "kubelet advertises them at start) or lower spec.{role}.resources.hugepages2Mi"
)


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """Per-pod requests of the checked resources (a limit alone counts as the request), in
    units for extended resources and in bytes for hugepages."""
    total: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name in CHECKED:
            if name in wanted:
                total[name] = total.get(name, 0) + _count(wanted[name])
    return {name: n for name, n in total.items() if n > 0}


def _count(value: Any) -> int:
    """A quantity as an integer (`16`, `5120Mi` -> bytes); 0 for what is not ours to judge."""
    found = _QUANTITY.match(str(value).strip())
    if not found:
        return 0
    return int(float(found.group(1)) * _FACTOR[found.group(2) or ""])


def _shown(name: str, amount: int) -> str:
    return f"{amount // MIB}Mi" if name == HUGEPAGES else str(amount)


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


def _matches(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    """One node selector requirement (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    key, op = requirement.get("key"), requirement.get("operator")
    wanted = [str(v) for v in requirement.get("values") or []]
    have = values.get(str(key))
    if op == "In":
        return have is not None and have in wanted
    if op == "NotIn":
        return have is None or have not in wanted
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and wanted:
        try:
            left, right = int(have), int(wanted[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def _required_affinity(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """The pod's required node affinity: any term whose requirements all hold (none: any)."""
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    labels = node.get("metadata", {}).get("labels") or {}
    fields = {"metadata.name": str(node.get("metadata", {}).get("name", ""))}
    return any(
        all(_matches(r, labels) for r in term.get("matchExpressions") or [])
        and all(_matches(r, fields) for r in term.get("matchFields") or [])
        for term in terms
    )


def eligible(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """The pod's nodeSelector and required node affinity match the node, and it tolerates the
    node's hard taints."""
    labels = node.get("metadata", {}).get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    if not _required_affinity(node, pod_spec):
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
        offered = max(_allocatable(n, name) for n in matching)
        if offered < count:
            plural = "node matches" if len(matching) == 1 else "nodes match"
            message = (
                f"{role} needs {_shown(name, count)} {name} per pod; the most any matching node "
                f"offers is {_shown(name, offered)} ({len(matching)} {plural})"
            )
            if name == HUGEPAGES:
                message += ": " + HUGEPAGES_HINT.format(role=role)
            return message
    fits = [n for n in matching if all(_allocatable(n, k) >= v for k, v in wanted.items())]
    if not fits:
        asked = ", ".join(f"{_shown(k, v)} {k}" for k, v in wanted.items())
        return f"{role} needs {asked} per pod together; no matching node offers all of them"
    return None


def _allocatable(node: Mapping[str, Any], name: str) -> int:
    return _count(((node.get("status") or {}).get("allocatable") or {}).get(name, 0))
