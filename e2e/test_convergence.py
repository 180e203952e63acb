"""Spec changes converge: scale, settings that roll pods through the config hash, a new image.

Every change is watched from the API server, so the test sees the status the operator actually
wrote: Progressing while the change rolls out, then Ready for the new generation. Pods are told
apart by UID (StatefulSet pods keep their names when replaced).
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster import Cluster
from kube import is_true
from suite import StatusWatch, apply, patched, pods, wait_ready

pytestmark = pytest.mark.cluster
CONFIG_HASH = "boomerang.dev/config-hash"
ENGINE_REVISION = "boomerang.dev/engine-revision"
EVENT_DEADLINE_S = 20


def _engine_pods(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["uid"]: p
        for p in pods(cluster, namespace, name)
        if p["metadata"]["labels"].get("boomerang.dev/role") in ("prefill", "decode")
    }


def _sts(cluster: Cluster, namespace: str, name: str, role: str) -> dict[str, Any]:
    return cluster.get_json("statefulset", f"{name}-{role}", "-n", namespace)


def _change(
    cluster: Cluster, namespace: str, manifest: dict[str, Any], path: str, value: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Apply one spec change; return the converged resource and every version seen meanwhile."""
    name = manifest["metadata"]["name"]
    changed = patched(manifest, path, value)
    with StatusWatch(cluster, namespace, name) as watch:
        apply(cluster, changed, namespace)
        dd = wait_ready(cluster, namespace, name, timeout=120)
    generation = dd["metadata"]["generation"]
    progressing = [
        v
        for v in watch.versions
        if (v.get("status") or {}).get("observedGeneration") == generation
        and is_true(v, "Progressing")
        and not is_true(v, "Ready")
    ]
    assert progressing, "status never showed Progressing for the new generation"
    return dd, watch.versions


def test_scaling_decode_converges_to_the_new_count(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    name = ready_minimal["metadata"]["name"]
    before = _engine_pods(cluster, namespace, name)
    dd, _ = _change(cluster, namespace, ready_minimal, "spec.decode.replicas", 3)
    assert dd["status"]["decode"] == {"desired": 3, "ready": 3, "updated": 3}
    assert dd["status"]["prefill"]["ready"] == 1
    assert _sts(cluster, namespace, name, "decode")["spec"]["replicas"] == 3
    after = _engine_pods(cluster, namespace, name)
    assert len(after) == 4
    assert set(before) <= set(after), "scaling replaced pods it should have kept"


def test_scale_changes_reach_ready_from_events_not_the_repair_timer(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    """Ready must follow the workloads' own events. The repair timer (60s) would also get
    there eventually; a deadline well under it catches a lost or stale status write."""
    name = ready_minimal["metadata"]["name"]
    manifest = ready_minimal
    for cycle in range(4):
        for replicas in (2, 1):
            manifest = patched(manifest, "spec.decode.replicas", replicas)
            apply(cluster, manifest, namespace)
            dd = wait_ready(cluster, namespace, name, timeout=EVENT_DEADLINE_S)
            decode = dd["status"]["decode"]
            # Ready may be reported while a surplus pod is still terminating after scale-down.
            assert decode["desired"] == replicas, f"cycle {cycle}: {decode}"
            assert decode["ready"] >= replicas, f"cycle {cycle}: {decode}"


@pytest.mark.parametrize(
    ("path", "value", "status_key", "expected", "router_sees_it"),
    [
        ("spec.kvTransfer.decoderBlocksTTL", "600s", "decoderBlocksTTLSeconds", 600, True),
        ("spec.kvTransfer.recomputeThreshold", 256, "recomputeThreshold", 256, False),
    ],
    ids=["decoder-ttl", "recompute-threshold"],
)
def test_kv_setting_change_rolls_every_engine_pod(
    cluster: Cluster,
    namespace: str,
    ready_minimal: dict[str, Any],
    path: str,
    value: Any,
    status_key: str,
    expected: int,
    router_sees_it: bool,
) -> None:
    name = ready_minimal["metadata"]["name"]
    router_config = cluster.get_json("configmap", f"{name}-router", "-n", namespace)["data"]
    hashes = {
        r: _sts(cluster, namespace, name, r)["spec"]["template"]["metadata"]["annotations"]
        for r in ("prefill", "decode")
    }
    before = _engine_pods(cluster, namespace, name)
    dd, _ = _change(cluster, namespace, ready_minimal, path, value)
    assert dd["status"]["kvTransfer"][status_key] == expected
    for role in ("prefill", "decode"):
        annotations = _sts(cluster, namespace, name, role)["spec"]["template"]["metadata"]
        assert annotations["annotations"][CONFIG_HASH] != hashes[role][CONFIG_HASH], role
    after = _engine_pods(cluster, namespace, name)
    assert len(after) == 2
    assert not set(before) & set(after), "some engine pods kept the old configuration"
    config = cluster.get_json("configmap", f"{name}-router", "-n", namespace)["data"]
    assert (config != router_config) == router_sees_it


def test_new_image_rolls_both_roles_to_one_engine_revision(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    name = ready_minimal["metadata"]["name"]
    old_revision = wait_ready(cluster, namespace, name)["status"]["engineRevision"]
    image = "boomerang/connector:0.2.0"
    dd, versions = _change(cluster, namespace, ready_minimal, "spec.engine.image", image)
    assert dd["status"]["engineRevision"] != old_revision
    assert dd["status"]["revisionSkew"] is False
    revisions = set()
    for role in ("prefill", "decode"):
        template = _sts(cluster, namespace, name, role)["spec"]["template"]
        assert template["spec"]["containers"][0]["image"] == image
        revisions.add(template["metadata"]["annotations"][ENGINE_REVISION])
    assert revisions == {dd["status"]["engineRevision"]}
    for pod in _engine_pods(cluster, namespace, name).values():
        assert pod["spec"]["containers"][0]["image"] == image
        assert is_true(pod, "Ready")
    assert any((v.get("status") or {}).get("engineRevision") != old_revision for v in versions)
