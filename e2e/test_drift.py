"""Drift is repaired and deletion garbage-collects: the operator owns its children for real.

Deleted children come back at once (the operator watches its children's deletions); edits by
someone else are reverted by the next full reconcile, at the latest on the repair timer.
Deleting the resource leaves nothing behind, through ownerReferences and the API server's
garbage collector, not through operator code that could be skipped.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from cluster import Cluster
from kube import wait_until
from suite import DD, children, get_dd, pods, wait_ready

pytestmark = pytest.mark.cluster
# Edits are repaired from child events within seconds; the 60 s timer is only a fallback.
REPAIR_TIMEOUT_S = 30


@pytest.fixture
def ready_name(ready_minimal: dict[str, Any]) -> str:
    """The name of the Ready `minimal.yaml` resource (conftest's `ready_minimal`)."""
    return str(ready_minimal["metadata"]["name"])


def _uid(cluster: Cluster, namespace: str, kind: str, name: str) -> str | None:
    result = cluster.kubectl(
        "get", kind, name, "-n", namespace, "-o", "jsonpath={.metadata.uid}", check=False
    )
    return result.stdout.strip() or None


@pytest.mark.parametrize(
    ("kind", "suffix"),
    [("statefulset", "decode"), ("configmap", "router"), ("service", "prefill")],
)
def test_deleted_child_is_recreated(
    cluster: Cluster, namespace: str, ready_name: str, kind: str, suffix: str
) -> None:
    name = f"{ready_name}-{suffix}"
    old = _uid(cluster, namespace, kind, name)
    assert old
    cluster.kubectl("delete", kind, name, "-n", namespace, "--wait=true")
    new = wait_until(
        f"{kind} {name} to be recreated",
        lambda: (uid := _uid(cluster, namespace, kind, name)) and uid != old and uid,
        timeout=30,
    )
    assert new != old
    wait_ready(cluster, namespace, ready_name)


def test_edited_children_are_reverted(cluster: Cluster, namespace: str, ready_name: str) -> None:
    """Values the operator owns, changed by someone else, come back."""
    name = ready_name
    edits = [
        ("service", f"{name}-router", "spec", {"sessionAffinity": "None"}),
        ("poddisruptionbudget", f"{name}-decode", "spec", {"maxUnavailable": 5}),
        ("statefulset", f"{name}-prefill", "spec", {"replicas": 4}),
        ("configmap", f"{name}-router", "data", {"router.yaml": "tampered: true\n"}),
    ]
    before = {
        (kind, child): _part(cluster, namespace, kind, child, part, edit)
        for kind, child, part, edit in edits
    }
    start = time.monotonic()
    for kind, child, part, edit in edits:
        patch = json.dumps({part: edit})
        result = cluster.kubectl(
            "patch", kind, child, "-n", namespace, "--type=merge", "-p", patch, "-o", "json"
        )
        # The patch response proves the edit landed; a GET may already see it repaired.
        patched = json.loads(result.stdout).get(part, {})
        assert {key: patched.get(key) for key in edit} == edit
    for kind, child, part, edit in edits:
        wait_until(
            f"{kind} {child} to be reverted",
            lambda k=kind, c=child, p=part, e=edit: (
                _part(cluster, namespace, k, c, p, e) == before[(k, c)]
            ),
            timeout=REPAIR_TIMEOUT_S,
            interval=1,
        )
    print(f"edits reverted after {time.monotonic() - start:.1f}s")
    wait_ready(cluster, namespace, name)
    # Ready may come while the three surplus prefill pods are still terminating (ready: 4);
    # the counts then follow the StatefulSet's own status events.
    wanted = {"desired": 1, "ready": 1, "updated": 1}
    wait_until(
        f"prefill status {wanted}",
        lambda: get_dd(cluster, namespace, name)["status"]["prefill"] == wanted,
        timeout=REPAIR_TIMEOUT_S,
        interval=0.5,
    )


def _part(
    cluster: Cluster, namespace: str, kind: str, name: str, part: str, keys: dict[str, Any]
) -> dict[str, Any]:
    """The values of `keys` under `part` (spec or data) of a live object."""
    live = cluster.get_json(kind, name, "-n", namespace).get(part, {})
    return {key: live.get(key) for key in keys}


def test_deleting_the_resource_collects_every_child(
    cluster: Cluster, namespace: str, ready_name: str
) -> None:
    assert children(cluster, namespace, ready_name)
    cluster.kubectl("delete", DD, ready_name, "-n", namespace, "--wait=true", timeout=120)
    wait_until(
        "every child and pod to be garbage-collected",
        lambda: (
            not children(cluster, namespace, ready_name)
            and not pods(cluster, namespace, ready_name)
        ),
        timeout=60,
        interval=0.5,
    )
