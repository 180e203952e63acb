"""What GitOps tools read: Argo CD's Lua health check and kstatus, on real status objects.

The status objects come from the operator on the real API server in three states: Ready
(Healthy), a scale-up whose new pods are held Pending by cordoned nodes (Progressing), and a
Ready resource whose pods were deleted while the nodes are cordoned, so replicas are missing
with no rollout to explain them (Degraded). Each is fed to `charts/boomerang/docs/argocd-health.lua`
under a Lua 5.1 interpreter, the language Argo CD embeds, and to the kstatus rules Flux applies.
Also here: `charts/install.yaml` is the chart rendered with its defaults.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest
from install_yaml import ROOT, render
from kube import wait_until
from suite import apply, get_dd, nodes_cordoned, patched, wait_ready

pytestmark = pytest.mark.cluster
HEALTH_LUA = ROOT / "charts" / "boomerang" / "docs" / "argocd-health.lua"


def lua(value: Any) -> str:
    """A JSON value as a Lua table constructor (what Argo CD hands the script as `obj`)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"[{json.dumps(k)}]={lua(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "{" + ",".join(lua(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nil"
    return json.dumps(value)


def argocd_health(obj: dict[str, Any]) -> tuple[str, str]:
    interpreter = shutil.which("lua5.1")
    if interpreter is None:
        if os.environ.get("CI"):
            pytest.fail("lua5.1 missing under CI (make lua)")
        pytest.skip("lua5.1 not installed (apt-get install lua5.1)")
    program = (
        f"obj = {lua(obj)}\n"
        f"local hs = dofile({json.dumps(str(HEALTH_LUA))})\n"
        "io.write(hs.status, '\\n', hs.message or '')\n"
    )
    out = subprocess.run(
        [interpreter, "-"], input=program, capture_output=True, text=True, check=True
    ).stdout
    status, _, message = out.partition("\n")
    return status, message


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus' rules for a custom resource, as Flux applies them."""
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"]["generation"]:
        return "InProgress"
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    if conditions.get("Stalled") == "True":
        return "Failed"
    if conditions.get("Reconciling") == "True" or conditions.get("Ready") != "True":
        return "InProgress"
    return "Current"


def test_health_of_real_status_objects(cluster, operator, namespace, ready_minimal) -> None:
    name = ready_minimal["metadata"]["name"]
    healthy = wait_ready(cluster, namespace, name)
    assert argocd_health(healthy)[0] == "Healthy"
    assert kstatus(healthy) == "Current"

    def reported(condition: str) -> dict[str, Any] | None:
        dd = get_dd(cluster, namespace, name)
        status = dd.get("status", {})
        found = {c["type"]: c["status"] for c in status.get("conditions", [])}
        current = status.get("observedGeneration") == dd["metadata"]["generation"]
        return dd if current and found.get(condition) == "True" else None

    with nodes_cordoned(cluster):
        apply(cluster, patched(ready_minimal, "spec.decode.replicas", 2), namespace)
        progressing = wait_until("Progressing", lambda: reported("Progressing"), timeout=60)
        assert argocd_health(progressing)[0] == "Progressing"
        assert kstatus(progressing) == "InProgress"
    wait_ready(cluster, namespace, name)

    with nodes_cordoned(cluster):
        cluster.kubectl(
            "delete", "pods", "-n", namespace, "-l", "boomerang.dev/role=decode", "--wait=false"
        )
        degraded = wait_until("Degraded", lambda: reported("Degraded"), timeout=60)
        status, message = argocd_health(degraded)
        assert status == "Degraded" and message.startswith("ReplicasUnavailable")
        assert kstatus(degraded) == "Failed"
    wait_ready(cluster, namespace, name)


def test_a_status_of_an_older_generation_is_progressing(ready_minimal) -> None:
    stale = {**ready_minimal, "metadata": {**ready_minimal["metadata"], "generation": 99}}
    stale["status"] = {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}
    assert argocd_health(stale)[0] == "Progressing"
    assert kstatus(stale) == "InProgress"


def test_install_yaml_is_the_chart_rendered_with_its_defaults(cluster) -> None:
    committed = (ROOT / "charts" / "install.yaml").read_text()
    assert committed == render(cluster.binaries / "helm"), "stale: run `make install-yaml`"
    assert "kind: CustomResourceDefinition" in committed and "kind: Namespace" in committed
