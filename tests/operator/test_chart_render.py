"""The Helm chart lints, and everything it renders validates against Kubernetes' schemas.

Runs the real `helm` built by `make tools`; the install itself is proven against a real API
server in e2e/test_chart.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cluster import bin_dir
from dd_testing import ROOT

CHART = ROOT / "charts" / "boomerang"
K8S_VERSION = "1.36.0"


@pytest.fixture(scope="module")
def helm() -> Path:
    path = bin_dir() / "helm"
    if not os.access(path, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"helm is missing at {path}: run `make tools`")
        pytest.skip("helm not built: run `make tools`")
    return path


def _helm(helm: Path, *args: str) -> str:
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _render(helm: Path, *sets: str) -> list[dict[str, Any]]:
    out = _helm(helm, "template", "boomerang", str(CHART), "-n", "boomerang-system", *sets)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_chart_lints_strictly(helm: Path) -> None:
    _helm(helm, "lint", "--strict", str(CHART))


@pytest.mark.parametrize(
    "sets",
    [(), ("--set", "watchNamespaces={team-a,team-b}", "--set", "verbose=true")],
    ids=["defaults", "namespaced"],
)
def test_rendered_objects_validate_against_kubernetes_schemas(
    helm: Path, sets: tuple[str, ...]
) -> None:
    docs = _render(helm, *sets)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
        "ServiceAccount",
    ]  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_chart_crd_is_the_generated_one_and_survives_uninstall(helm: Path) -> None:
    crd = next(d for d in _render(helm) if d["kind"] == "CustomResourceDefinition")
    committed = yaml.safe_load(
        (ROOT / "crds" / "boomerang.dev_disaggregateddeployments.yaml").read_text()
    )
    assert crd["spec"] == committed["spec"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_crds_can_be_left_to_gitops(helm: Path) -> None:
    kinds = [d["kind"] for d in _render(helm, "--set", "crds.install=false")]
    assert "CustomResourceDefinition" not in kinds


def test_values_schema_rejects_a_typo(helm: Path) -> None:
    result = subprocess.run(
        [str(helm), "template", "x", str(CHART), "--set", "watchNamespace=a"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "watchNamespace" in result.stderr


def test_operator_runs_unprivileged_with_its_namespaces(helm: Path) -> None:
    docs = _render(helm, "--set", "watchNamespaces={team-a}")
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
        DEFAULT_ENGINE_IMAGE, DEFAULT_ROUTER_IMAGE, IMAGE_REGISTRY, IMAGE_TAG,
        DisaggregatedDeployment,
    )  # fmt: skip

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert IMAGE_TAG == project == chart["appVersion"]
    assert values["image"]["registry"] == IMAGE_REGISTRY
    assert _operator_image(_render(helm)) == f"{IMAGE_REGISTRY}/operator:{IMAGE_TAG}"
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
    assert _operator_image(_render(helm, *sets)).startswith(image)
