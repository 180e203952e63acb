"""Every sample in examples/ reconciles, through the real API server, to Ready children.

The operator runs as the chart's ServiceAccount, so this also proves the chart grants enough:
the API server's audit log must show no request of the operator denied. Expectations are read
from the sample itself (replicas, GPUs, EFA, node selection), not from the operator's builders.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster import Cluster
from kube import condition, is_true
from kubernetes.utils import parse_quantity
from operator_process import OperatorProcess
from suite import apply, children, example, examples, operator_user, pods, wait_ready

from boomerang.operator.api import DisaggregatedDeployment, parse_duration

pytestmark = pytest.mark.cluster
ROLES = ("prefill", "decode")


def _expected_children(name: str) -> set[tuple[str, str]]:
    router = f"{name}-router"
    return {
        ("StatefulSet", f"{name}-prefill"),
        ("StatefulSet", f"{name}-decode"),
        ("Service", f"{name}-prefill"),
        ("Service", f"{name}-decode"),
        ("Service", router),
        ("Deployment", router),
        ("ConfigMap", router),
        ("ServiceAccount", router),
        ("Role", router),
        ("RoleBinding", router),
        ("PodDisruptionBudget", f"{name}-prefill"),
        ("PodDisruptionBudget", f"{name}-decode"),
        ("PodDisruptionBudget", router),
        ("NetworkPolicy", f"{name}-engines"),
    }


def _check_engine_role(sts: dict[str, Any], svc: dict[str, Any], role: Any, efa: bool) -> None:
    """The StatefulSet fields users rely on, against the sample's role spec."""
    assert sts["spec"]["replicas"] == role.replicas
    assert sts["status"].get("readyReplicas") == role.replicas
    pod = sts["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    limits = engine.get("resources", {}).get("limits", {})
    res = role.resources
    assert limits.get("nvidia.com/gpu") == (str(res.gpus) if res.gpus else None)
    assert limits.get("vpc.amazonaws.com/efa") == (str(res.efa) if res.efa else None)
    # The API server canonicalises quantities (5120Mi is stored as 5Gi): compare amounts.
    for key, wanted in (
        ("hugepages-2Mi", res.hugepages2_mi),
        ("cpu", res.cpu),
        ("memory", res.memory),
    ):
        if wanted:
            assert parse_quantity(limits[key]) == parse_quantity(wanted), key
    assert pod.get("nodeSelector", {}) == role.node_selector
    for toleration in role.tolerations:
        assert toleration in pod.get("tolerations", [])
    env = {e["name"]: e.get("value") for e in engine.get("env", [])}
    if efa:
        assert env.get("FI_PROVIDER") == "efa"
        assert "IPC_LOCK" in engine["securityContext"]["capabilities"]["add"]
    # The headless Service gives every engine pod DNS and selects exactly this role's pods.
    assert svc["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize("sample", examples())
def test_sample_reconciles_to_ready_children(
    cluster: Cluster, operator: OperatorProcess, namespace: str, sample: str
) -> None:
    manifest = example(sample)
    name = manifest["metadata"]["name"]
    spec = DisaggregatedDeployment.model_validate(manifest).spec
    audit_mark = cluster.audit.mark()
    apply(cluster, manifest, namespace)
    dd = wait_ready(cluster, namespace, name, timeout=120)

    kids = children(cluster, namespace, name)
    assert _expected_children(name) <= set(kids), sorted(kids)
    for (kind, child), obj in kids.items():
        owners = obj["metadata"].get("ownerReferences", [])
        assert [o["uid"] for o in owners if o.get("controller")] == [dd["metadata"]["uid"]], (
            f"{kind} {child} is not owned by the resource"
        )
    for role_name in ROLES:
        role = getattr(spec, role_name)
        sts = kids[("StatefulSet", f"{name}-{role_name}")]
        _check_engine_role(sts, kids[("Service", f"{name}-{role_name}")], role, spec.uses_efa)
        image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == spec.engine.image
        want = {"desired": role.replicas, "ready": role.replicas, "updated": role.replicas}
        if role.replicas_from == "Scaler":  # its scaler, seeded from the spec, owns the count
            want["scaler"] = f"DisaggregatedRoleScaler/{name}-{role_name}"
        assert dd["status"][role_name] == want
    router = kids[("Deployment", f"{name}-router")]
    assert router["spec"]["replicas"] == spec.router.replicas
    assert dd["status"]["router"]["ready"] == spec.router.replicas
    assert kids[("Service", f"{name}-router")]["spec"]["type"] == spec.router.service.type
    for component in (*ROLES, "router"):
        pdb = kids[("PodDisruptionBudget", f"{name}-{component}")]
        assert pdb["spec"]["maxUnavailable"] == 1

    # Conditions and effective settings
    assert is_true(dd, "Ready")
    assert not is_true(dd, "Progressing"), condition(dd, "Progressing")
    assert not is_true(dd, "Degraded"), condition(dd, "Degraded")
    kv = dd["status"]["kvTransfer"]
    assert kv["decoderBlocksTTLSeconds"] == parse_duration(spec.kv_transfer.decoder_blocks_ttl)
    assert kv["backend"] == ("LIBFABRIC" if spec.uses_efa else "UCX")

    # kwok made every pod Running and Ready, on a node that satisfies its requests.
    running = pods(cluster, namespace, name)
    total = spec.prefill.replicas + spec.decode.replicas + spec.router.replicas
    assert len([p for p in running if is_true(p, "Ready")]) == total

    # The chart granted enough: not one of the operator's requests was denied.
    denied = cluster.audit.denials(operator_user(), since=audit_mark)
    assert not denied, f"operator requests denied by RBAC: {denied}"
