"""Restarts: the operator killed mid-reconcile, and the API server restarted, both converge.

A level-based reconciler must not care where it was interrupted: after a SIGKILL between
creating some children and others, the next run converges to exactly one set of children.
An API server restart drops every watch; the operator must reconnect and act on later changes.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster import Cluster
from kube import wait_until
from operator_process import OperatorProcess
from suite import apply, children, example, patched, pods, wait_ready

pytestmark = pytest.mark.cluster
LABEL = "boomerang.dev/deployment"
NAMES = tuple(f"restart-{i}" for i in range(6))
CHILDREN_EACH = 14  # what one minimal resource owns (see test_samples)


def _named(name: str) -> dict[str, Any]:
    return patched(example("minimal.yaml"), "metadata.name", name)


def _count(items: list[dict[str, Any]], kind: str) -> int:
    return sum(1 for obj in items if obj["kind"] == kind)


# The child kinds counted while racing the operator: 11 objects per resource.
RACED_KINDS = {
    "/api/v1": ("serviceaccounts", "configmaps", "services"),
    "/apis/apps/v1": ("statefulsets", "deployments"),
    "/apis/policy/v1": ("poddisruptionbudgets",),
}
RACED_EACH = 11


def _owned_count(cluster: Cluster, namespace: str) -> int:
    """Children in the namespace, read straight from the API (fast enough to race the operator)."""
    total = 0
    for prefix, kinds in RACED_KINDS.items():
        for kind in kinds:
            items = cluster.request(f"{prefix}/namespaces/{namespace}/{kind}")["items"]
            total += sum(1 for o in items if LABEL in (o["metadata"].get("labels") or {}))
    return total


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    cluster.apply_objects([_named(n) for n in NAMES], namespace=namespace)
    # SIGKILL as soon as the first child exists: the operator is part-way through its work.
    wait_until(
        "the first child to exist",
        lambda: _owned_count(cluster, namespace) > 0,
        timeout=60,
        interval=0.01,
    )
    operator.kill()
    at_kill = _owned_count(cluster, namespace)
    operator.start()
    assert at_kill < len(NAMES) * RACED_EACH, "the operator finished before it could be interrupted"
    for name in NAMES:
        dd = wait_ready(cluster, namespace, name, timeout=120)
        kids = list(children(cluster, namespace, name).values())
        assert len(kids) == CHILDREN_EACH, sorted(k["kind"] for k in kids)
        assert _count(kids, "StatefulSet") == 2
        assert _count(kids, "Deployment") == 1
        replicasets = cluster.get_json("replicasets", "-n", namespace, "-l", f"{LABEL}={name}")
        assert len(replicasets["items"]) == 1, "the router Deployment rolled after the restart"
        expected = 1 + 1 + dd["status"]["router"]["desired"]
        assert len(pods(cluster, namespace, name)) == expected
    print(f"killed with {at_kill} of {len(NAMES) * RACED_EACH} checked children created")


def test_apiserver_restart_is_survived(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    manifest = example("minimal.yaml")
    name = manifest["metadata"]["name"]
    apply(cluster, manifest, namespace)
    wait_ready(cluster, namespace, name)
    cluster.restart_apiserver()
    assert operator.alive(), operator.log_text()[-2000:]
    apply(cluster, patched(manifest, "spec.decode.replicas", 2), namespace)
    dd = wait_ready(cluster, namespace, name, timeout=120)
    assert dd["status"]["decode"] == {"desired": 2, "ready": 2, "updated": 2}
