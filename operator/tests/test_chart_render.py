"""The Helm chart lints, and everything it renders validates against Kubernetes' schemas.

Runs the real `helm` built by `make tools`; the install itself is proven against a real API
server in e2e/test_chart.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_testing import CHART, refused, render_chart, run_helm
from dd_testing import ROOT

from boomerang.operator.children import CHILD_KINDS, CREATE_ONLY_KINDS, CREATED_KINDS

K8S_VERSION = "1.36.0"


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def _peering_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """kopf's peering CRDs from the chart's crds/, keyed by (apiVersion, kind) they serve."""
    crds = yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text())
    return {
        (f"{c['spec']['group']}/{v['name']}", c["spec"]["names"]["kind"]): c
        for c in crds
        for v in c["spec"]["versions"]
    }


def _validate(doc: dict[str, Any]) -> None:
    """Kubernetes' own kinds against Kubernetes' schemas; kopf's peering objects against the
    CRDs the chart ships for them."""
    crd = _peering_crds().get((doc["apiVersion"], doc["kind"]))
    if crd is None:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return
    [version] = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    assert set(doc) <= {"apiVersion", "kind", "metadata", *schema["properties"]}
    jsonschema.validate(doc, schema)
    assert (crd["spec"]["scope"] == "Namespaced") == ("namespace" in doc["metadata"])


def test_chart_lints_strictly(helm: Path) -> None:
    run_helm(helm, "lint", "--strict", str(CHART))


DEFAULT_KINDS = [
    "ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "CustomResourceDefinition", "Deployment", "PodDisruptionBudget", "ServiceAccount",
]  # fmt: skip
NAMESPACED_KINDS = [
    "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "CustomResourceDefinition",
    "Deployment", "KopfPeering",
    "KopfPeering", "PodDisruptionBudget", "Role", "Role", "RoleBinding", "RoleBinding",
    "ServiceAccount",
]  # fmt: skip
TEAMS = ("--set", "watchNamespaces={team-a,team-b}")


@pytest.mark.parametrize(
    ("sets", "kinds"),
    [((), DEFAULT_KINDS), ((*TEAMS, "--set", "verbose=true"), NAMESPACED_KINDS)],
    ids=["defaults", "namespaced"],
)
def test_rendered_objects_validate_against_kubernetes_schemas(
    helm: Path, sets: tuple[str, ...], kinds: list[str]
) -> None:
    docs = render_chart(helm, *sets)
    assert sorted(d["kind"] for d in docs) == kinds
    for doc in docs:
        _validate(doc)


@pytest.mark.parametrize("plural", ["disaggregateddeployments", "disaggregatedrolescalers"])
def test_chart_crd_is_the_generated_one_and_survives_uninstall(helm: Path, plural: str) -> None:
    crd = next(
        d
        for d in render_chart(helm)
        if d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"].startswith(plural)
    )
    committed = yaml.safe_load((ROOT / "crds" / f"boomerang.dev_{plural}.yaml").read_text())
    assert crd["spec"] == committed["spec"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_crds_can_be_left_to_gitops(helm: Path) -> None:
    kinds = [d["kind"] for d in render_chart(helm, "--set", "crds.install=false")]
    assert "CustomResourceDefinition" not in kinds


def test_values_schema_rejects_a_typo(helm: Path) -> None:
    assert "watchNamespace" in refused(helm, "--set", "watchNamespace=a")


def test_operator_runs_unprivileged_with_its_namespaces(helm: Path) -> None:
    docs = render_chart(helm, "--set", "watchNamespaces={team-a}")
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "boomerang-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "--namespace=team-a" in pod["containers"][0]["args"]


def _operator_image(docs: list[dict[str, Any]]) -> str:
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    return str(deploy["spec"]["template"]["spec"]["containers"][0]["image"])


def test_every_default_image_is_the_published_one_of_this_release(helm: Path) -> None:
    """One registry and one version: the chart's operator image, the resource's engine and
    router images, the project's version and the chart's appVersion all agree."""
    import tomllib

    from boomerang.operator.api import (
        DEFAULT_ENGINE_IMAGE,
        DEFAULT_ROUTER_IMAGE,
        IMAGE_REGISTRY,
        IMAGE_TAG,
        DisaggregatedDeployment,
    )  # fmt: skip

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert IMAGE_TAG == project == chart["appVersion"]
    assert values["image"]["registry"] == IMAGE_REGISTRY
    assert _operator_image(render_chart(helm)) == f"{IMAGE_REGISTRY}/operator:{IMAGE_TAG}"
    dd = DisaggregatedDeployment.model_validate(
        {"metadata": {"name": "x"}, "spec": {"model": {"source": "hf://a/b", "servedName": "b"}}}
    )
    assert dd.spec.engine.image == DEFAULT_ENGINE_IMAGE == f"{IMAGE_REGISTRY}/connector:{IMAGE_TAG}"
    assert dd.spec.router.image == DEFAULT_ROUTER_IMAGE == f"{IMAGE_REGISTRY}/router:{IMAGE_TAG}"


@pytest.mark.parametrize(
    ("sets", "image"),
    [
        (("--set", "image.registry=registry.example.com/team"), "registry.example.com/team/"),
        (("--set", "image.registry=", "--set", "image.repository=mirror/op"), "mirror/op:"),
    ],
    ids=["own-registry", "repository-alone"],
)
def test_one_registry_value_moves_the_operator_image(
    helm: Path, sets: tuple[str, ...], image: str
) -> None:
    assert _operator_image(render_chart(helm, *sets)).startswith(image)


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(_one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0])


def test_defaults_run_two_replicas_that_elect_a_leader_through_kopf_peering(helm: Path) -> None:
    docs = render_chart(helm)
    deploy = _one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    container = _container(docs)
    peering = _one(docs, "ClusterKopfPeering")
    assert f"--peering={peering['metadata']['name']}" in container["args"]
    assert "--all-namespaces" in container["args"]
    [pod_name] = [e for e in container["env"] if e["name"] == "POD_NAME"]
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # Ready is alive (a paused standby counts as available), not "is the leader".
    assert container["readinessProbe"]["httpGet"] == container["livenessProbe"]["httpGet"]
    assert container["readinessProbe"]["httpGet"]["port"] == "health"
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_peering_crds_are_created_before_the_peering_object(helm: Path) -> None:
    """Helm installs crds/ before rendering templates: in templates/ beside the peering object,
    the install would fail (no mapping for its kind yet)."""
    crds = _peering_crds()
    assert {k: c["spec"]["scope"] for k, c in crds.items()} == {
        ("kopf.dev/v1", "ClusterKopfPeering"): "Cluster",
        ("kopf.dev/v1", "KopfPeering"): "Namespaced",
    }
    plain = [d["kind"] for d in render_chart(helm)]
    assert "ClusterKopfPeering" in plain and "CustomResourceDefinition" in plain
    with_crds = render_chart(helm, "--include-crds")
    names = {d["metadata"]["name"] for d in with_crds if d["kind"] == "CustomResourceDefinition"}
    assert {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"} <= names
    for crd in crds.values():
        kubernetes_validate.validate(crd, K8S_VERSION, strict=True)


def _rules(role: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted(
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    )


def test_namespaced_install_grants_workloads_only_in_the_watched_namespaces(helm: Path) -> None:
    docs = render_chart(helm, *TEAMS)
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    sa = _one(docs, "ServiceAccount")["metadata"]
    for namespace, binding in bindings.items():
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[namespace]["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
        ]
    granted = _rules(roles["team-a"])
    for resource in ("statefulsets", "deployments", "services", "rolebindings"):
        assert any(r == resource and v == "patch" for _, r, v in granted), resource
    assert ("kopf.dev", "kopfpeerings", "patch") in granted
    assert ("", "pods", "watch") in granted and ("", "pods", "create") not in granted
    # Cluster-wide: reading the CRDs and namespaces, which kopf needs; nothing else (not even
    # nodes: the operator then skips its preflight).
    cluster_role = _one(docs, "ClusterRole")
    assert {(g, r) for g, r, _ in _rules(cluster_role)} == {
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("", "namespaces"),
    }
    assert {v for _, _, v in _rules(cluster_role)} == {"get", "list", "watch"}
    # One peering object per watched namespace: kopf heartbeats where it watches.
    peerings = [d for d in docs if d["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    container = _container(docs)
    assert f"--peering={peerings[0]['metadata']['name']}" in container["args"]
    assert {"--namespace=team-a", "--namespace=team-b"} <= set(container["args"])


APPLY_VERBS = {"get", "list", "watch", "create", "patch"}
"""What the operator does to a child: server-side apply (create or patch), and watch it for
drift. Never delete: children go with their owner (garbage collection)."""


@pytest.mark.parametrize("sets", [(), TEAMS], ids=["cluster-wide", "namespaced"])
def test_rbac_lets_the_operator_apply_exactly_the_child_kinds(
    helm: Path, sets: tuple[str, ...]
) -> None:
    """The chart's grants follow children.CHILD_KINDS: every kind the operator applies and
    watches, the create-only Secret of the lease token, and nothing else it may create (but the
    events it posts)."""
    docs = render_chart(helm, *sets)
    granted = set(_rules(next(d for d in docs if d["kind"] == ("Role" if sets else "ClusterRole"))))
    for kind in (*CHILD_KINDS, *CREATED_KINDS):
        verbs = {v for g, r, v in granted if (g, r) == (kind.group, kind.plural)}
        assert verbs == APPLY_VERBS, kind
    for kind in CREATE_ONLY_KINDS:  # the lease token: created blind, never read
        verbs = {v for g, r, v in granted if (g, r) == (kind.group, kind.plural)}
        assert verbs == {"create"}, kind
    creatable = {(g, r) for g, r, v in granted if v == "create" and r != "events"}
    kinds = (*CHILD_KINDS, *CREATED_KINDS, *CREATE_ONLY_KINDS)
    assert creatable == {(k.group, k.plural) for k in kinds}
    replaces = {(r, v) for _, r, v in granted if v in ("delete", "deletecollection", "update")}
    assert replaces == {("disaggregateddeployments/finalizers", "update")}


def test_cluster_wide_and_namespaced_installs_grant_the_same_workload_rules(helm: Path) -> None:
    cluster_wide = set(_rules(_one(render_chart(helm), "ClusterRole")))
    assert ("", "nodes", "list") in cluster_wide and ("", "nodes", "patch") not in cluster_wide
    namespaced = set(_rules(next(d for d in render_chart(helm, *TEAMS) if d["kind"] == "Role")))
    kopf = {"clusterkopfpeerings", "customresourcedefinitions", "kopfpeerings", "nodes"}
    assert {r for r in cluster_wide if r[1] not in kopf} == {
        r for r in namespaced if r[1] not in kopf
    }


def test_leader_election_off_is_one_standalone_replica(helm: Path) -> None:
    docs = render_chart(helm, "--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ClusterKopfPeering", "KopfPeering", "PodDisruptionBudget"}
    deploy = _one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"]["type"] == "Recreate"
    assert not any(a.startswith("--peering") for a in _container(docs)["args"])
    assert not any(r[0] == "kopf.dev" for r in _rules(_one(docs, "ClusterRole")))


def test_two_standalone_replicas_are_refused(helm: Path) -> None:
    error = refused(helm, "--set", "leaderElection.enabled=false")
    assert "replicaCount > 1 needs leaderElection.enabled" in error


def test_two_releases_claim_no_common_cluster_scoped_object(helm: Path) -> None:
    """A second, namespaced release (one per team) installs beside the default one."""

    def cluster_scoped(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
        skip = {"CustomResourceDefinition"}  # the CRD is shared: the second leaves it out
        return {
            (d["kind"], d["metadata"]["name"])
            for d in docs
            if "namespace" not in d["metadata"] and d["kind"] not in skip
        }

    first = cluster_scoped(render_chart(helm))
    second = cluster_scoped(render_chart(helm, *TEAMS, release="team"))
    assert first and second and not first & second


def test_values_schema_rejects_a_namespace_pattern(helm: Path) -> None:
    """Roles need exact namespaces: kopf's globs cannot be granted to."""
    assert "watchNamespaces" in refused(helm, "--set", "watchNamespaces={team-*}")
