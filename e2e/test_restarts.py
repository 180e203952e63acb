"""Restarts: the operator killed mid-reconcile, and the API server restarted, both converge.

A level-based reconciler must not care where it was interrupted: after a SIGKILL between
creating some children and others, the next run converges to exactly one set of children.
An API server restart drops every watch; the operator must reconnect and act on later changes.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster import Cluster
from kube import is_true, wait_until
from operator_process import OperatorProcess
from suite import apply, children, example, get_dd, patched, pods, wait_ready

pytestmark = pytest.mark.cluster
NAMES = ("alpha", "beta", "gamma")


def _named(name: str) -> dict[str, Any]:
    return patched(example("minimal.yaml"), "metadata.name", name)


def _count(items: list[dict[str, Any]], kind: str) -> int:
    return sum(1 for obj in items if obj["kind"] == kind)


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    for name in NAMES:
        apply(cluster, _named(name), namespace)
    # Kill as soon as the first children exist, before anything is Ready.
    wait_until(
        "the first children to exist",
        lambda: children(cluster, namespace, NAMES[0]),
        timeout=60,
        interval=0.05,
    )
    assert not is_true(get_dd(cluster, namespace, NAMES[0]), "Ready")
    operator.kill()
    operator.start()
    for name in NAMES:
        dd = wait_ready(cluster, namespace, name, timeout=120)
        kids = list(children(cluster, namespace, name).values())
        assert _count(kids, "StatefulSet") == 2
        assert _count(kids, "Deployment") == 1
        assert _count(kids, "Service") == 3
        replicasets = cluster.get_json(
            "replicasets", "-n", namespace, "-l", f"boomerang.dev/deployment={name}"
        )["items"]
        assert len(replicasets) == 1, "the router Deployment rolled needlessly after the restart"
        expected = 1 + 1 + dd["status"]["router"]["desired"]
        assert len(pods(cluster, namespace, name)) == expected


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
