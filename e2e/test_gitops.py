"""GitOps friendliness: re-applying the same manifest is a no-op, diff is empty, status is quiet.

Argo CD and Flux re-apply manifests all the time and show `kubectl diff`. If either showed a
change after reconcile, or status kept moving, every sync would look out of date.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from cluster import Cluster
from suite import DD, EXAMPLES, StatusWatch, apply, children, get_dd, wait_ready

pytestmark = pytest.mark.cluster


def _versions(cluster: Cluster, namespace: str, name: str) -> dict[tuple[str, str], str]:
    found = {
        k: v["metadata"]["resourceVersion"] for k, v in children(cluster, namespace, name).items()
    }
    found[("DisaggregatedDeployment", name)] = get_dd(cluster, namespace, name)["metadata"][
        "resourceVersion"
    ]
    return found


def test_server_side_reapply_of_the_same_manifest_changes_nothing(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    name = ready_minimal["metadata"]["name"]
    time.sleep(2)  # let the last status write of the initial rollout land
    before = _versions(cluster, namespace, name)
    apply(cluster, ready_minimal, namespace)
    time.sleep(3)  # time for any reconcile the re-apply might have caused
    assert _versions(cluster, namespace, name) == before


@pytest.mark.parametrize("mode", ["server-side", "client-side"])
def test_kubectl_diff_of_the_sample_is_empty_after_reconcile(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any], mode: str
) -> None:
    args = ["diff", "-f", str(EXAMPLES / "minimal.yaml"), "-n", namespace]
    if mode == "server-side":
        args += ["--server-side", "--field-manager=e2e", "--force-conflicts"]
    result = cluster.kubectl(*args, check=False)
    assert result.returncode == 0, f"kubectl diff ({mode}) shows changes:\n{result.stdout}"
    assert result.stdout == ""


def test_status_does_not_flap_when_reconciled_again(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    """Forced reconciles (an annotation change triggers one) must leave status as it is."""
    name = ready_minimal["metadata"]["name"]
    settled = wait_ready(cluster, namespace, name)["status"]
    with StatusWatch(cluster, namespace, name) as watch:
        for i in range(3):
            cluster.kubectl("annotate", DD, name, "-n", namespace, f"e2e/touch={i}", "--overwrite")
            time.sleep(1.5)
        time.sleep(2)
    statuses = {json.dumps(v.get("status"), sort_keys=True) for v in watch.versions}
    assert statuses == {json.dumps(settled, sort_keys=True)}, "status changed without a cause"
    assert len(watch.versions) >= 4, "the annotation changes were not observed"
