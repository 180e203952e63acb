"""The Helm chart installs on a real API server and publishes a documented, working CRD."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster
from kube import is_true, wait_until
from suite import DD, RELEASE, SERVICE_ACCOUNT, operator_user

from boomerang.operator import api

pytestmark = pytest.mark.cluster


def test_helm_install_is_deployed_with_the_operator_identity(cluster: Cluster, chart: str) -> None:
    status = json.loads(cluster.helm("status", RELEASE, "-n", chart, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    cluster.get_json("serviceaccount", SERVICE_ACCOUNT, "-n", chart)
    bindings = cluster.get_json("clusterrolebindings")["items"]
    subjects = [s for b in bindings for s in b.get("subjects") or []]
    assert {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": chart} in subjects


def test_operator_runs_two_ready_replicas_under_a_disruption_budget(
    cluster: Cluster, chart: str
) -> None:
    """kwok plays the pods (they run no process), so this proves the objects, not the election:
    that is test_leader_election.py."""
    deploy = cluster.get_json("deployment", "boomerang-operator", "-n", chart)
    assert deploy["status"]["readyReplicas"] == 2

    def both_healthy() -> dict[str, Any] | None:
        pdb = cluster.get_json("pdb", "boomerang-operator", "-n", chart)
        return pdb if (pdb.get("status") or {}).get("currentHealthy") == 2 else None

    pdb = wait_until("the PDB to count both replicas", both_healthy, timeout=30)
    assert pdb["status"]["disruptionsAllowed"] == 1
    peering = cluster.get_json("clusterkopfpeering", "boomerang-operator")
    assert peering["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    for crd in ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        assert is_true(cluster.get_json("crd", crd), "Established")


def test_crd_is_established_with_its_short_name(cluster: Cluster, chart: str) -> None:
    def established() -> dict[str, Any] | None:
        crd = cluster.get_json("crd", DD)
        return crd if is_true(crd, "Established") else None

    crd = wait_until("the CRD to be Established", established, timeout=30)
    assert is_true(crd, "NamesAccepted")
    assert crd["spec"]["names"]["kind"] == api.KIND
    assert "dd" in crd["spec"]["names"]["shortNames"]
    served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    assert served == [api.VERSION]
    # The short name resolves through discovery, the way users type it.
    assert cluster.kubectl("get", "dd", "-A").returncode == 0


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize(
    ("path", "model", "field"),
    [
        ("spec.kvTransfer.decoderBlocksTTL", api.KVTransferSpec, "decoder_blocks_ttl"),
        ("spec.kvTransfer.recomputeThreshold", api.KVTransferSpec, "recompute_threshold"),
        ("spec.prefill.resources.efa", api.RoleResources, "efa"),
        ("spec.model.source", api.ModelSpec, "source"),
        ("spec.router.store", api.RouterSpec, "store"),
    ],
)
def test_kubectl_explain_shows_the_api_field_descriptions(
    cluster: Cluster, chart: str, path: str, model: type, field: str
) -> None:
    description = model.model_fields[field].description
    assert description
    out = cluster.kubectl("explain", f"dd.{path}").stdout
    assert _words(description) in _words(out), out


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("patch", "statefulsets.apps", "yes"),
        ("patch", "disaggregateddeployments.boomerang.dev/status", "yes"),
        ("list", "endpointslices.discovery.k8s.io", "yes"),
        ("get", "secrets", "no"),
        ("delete", "statefulsets.apps", "no"),
        ("create", "pods", "no"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", "no"),
        ("escalate", "roles.rbac.authorization.k8s.io", "no"),
        ("patch", "clusterkopfpeerings.kopf.dev/boomerang-operator", "yes"),
        ("patch", "clusterkopfpeerings.kopf.dev/someone-elses", "no"),
        ("delete", "clusterkopfpeerings.kopf.dev", "no"),
    ],
)
def test_operator_identity_gets_what_it_needs_and_no_more(
    cluster: Cluster, chart: str, tmp_path: Path, verb: str, resource: str, allowed: str
) -> None:
    kubeconfig = cluster.service_account_kubeconfig(
        chart, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig", duration="10m"
    )
    result = cluster.kubectl(
        "auth", "can-i", verb, resource, "-A", kubeconfig=kubeconfig, check=False
    )
    assert result.stdout.strip() == allowed


def test_a_denied_request_shows_in_the_audit_log(
    cluster: Cluster, chart: str, tmp_path: Path
) -> None:
    """The samples test trusts the audit log to show RBAC denials: prove that it does."""
    kubeconfig = cluster.service_account_kubeconfig(
        chart, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig", duration="10m"
    )
    mark = cluster.audit.mark()
    result = cluster.kubectl("get", "secrets", "-n", "default", kubeconfig=kubeconfig, check=False)
    assert result.returncode != 0 and "forbidden" in result.stderr
    denied = wait_until(
        "the denial in the audit log",
        lambda: cluster.audit.denials(operator_user(), since=mark),
        timeout=10,
    )
    assert denied == ["list secrets default"]
