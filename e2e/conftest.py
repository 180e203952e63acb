"""Fixtures for the operator's end-to-end suite on a real control plane.

One control plane per session (starting it costs seconds, building it minutes): the chart is
installed once with helm, and the operator runs once as the chart's ServiceAccount. Each test
gets its own namespace, so tests don't see each other's resources.

Without the binaries (`make tools`) the cluster tests skip locally; under CI (`CI` set) a
missing binary is a failure, so CI can never pass by skipping them.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster, bin_dir, missing_binaries
from operator_process import OperatorProcess
from suite import CHART, RELEASE, RELEASE_NAMESPACE, apply, example, install_chart, wait_ready


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = missing_binaries()
    if missing:
        message = f"control plane binaries missing in {bin_dir()} ({', '.join(missing)}): "
        message += "run `make tools`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with Cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(scope="session")
def chart(cluster: Cluster) -> str:
    """The chart installed with helm into its release namespace; returns that namespace."""
    install_chart(cluster, CHART, RELEASE, RELEASE_NAMESPACE)
    return RELEASE_NAMESPACE


@pytest.fixture(scope="session")
def operator_session(cluster: Cluster, chart: str) -> Iterator[OperatorProcess]:
    kubeconfig = cluster.service_account_kubeconfig(
        chart, "boomerang-operator", cluster.workdir / "operator.kubeconfig"
    )
    proc = OperatorProcess(kubeconfig, cluster.workdir / "logs" / "operator.log")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def operator(operator_session: OperatorProcess) -> OperatorProcess:
    """The operator, authenticated as the chart's ServiceAccount (RBAC enforced); a test that
    killed it and failed before restarting it does not take the next tests down with it."""
    if not operator_session.alive():
        operator_session.start()
    return operator_session


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test; deleted (without waiting) afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8]
    name = f"t-{slug}"[:50].rstrip("-") + f"-{digest}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def ready_minimal(cluster: Cluster, operator: OperatorProcess, namespace: str) -> dict[str, Any]:
    """The `minimal.yaml` sample applied in the test's namespace and Ready; its manifest."""
    manifest = example("minimal.yaml")
    apply(cluster, manifest, namespace)
    wait_ready(cluster, namespace, manifest["metadata"]["name"])
    return manifest
