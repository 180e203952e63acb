"""Status says why a resource is not Ready, from the spec and from the pods, within seconds.

Faults kwok's fake p5en.48xlarge nodes (8 nvidia.com/gpu, 16 vpc.amazonaws.com/efa, 64Gi of
hugepages-2Mi) can show on the real control plane:
- a pod asking for more EFA, or more 2 MiB hugepages, than any node has: the operator's
  preflight compares the request with the nodes and says `Degraded/InsufficientCapacity` with
  the numbers (and, for hugepages, what to change), before any pod pends;
- a nodeSelector no node matches: the real scheduler marks the pod Unschedulable and the
  operator, watching the resource's pods, says `Degraded/Unschedulable` with the scheduler's
  own message.
Each then becomes Ready once the spec is fixed. Image pull failures, crash loops, OOM kills and
failing startup probes cannot be simulated here: kwok runs no containers and makes every
scheduled pod Running and Ready. The table tests of `boomerang.operator.pods`
(operator/tests/test_pods.py) cover those from realistic pod JSON.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from cluster import Cluster
from kube import condition, is_true, wait_until
from suite import apply, example, get_dd, patched, wait_ready

pytestmark = pytest.mark.cluster
PROMPT_S = 20
"""Seconds within which status must name the fault (the repair timer alone would take 60)."""


def _degraded(cluster: Cluster, namespace: str, name: str, reason: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        dd = get_dd(cluster, namespace, name)
        found = condition(dd, "Degraded") or {}
        current = (dd.get("status") or {}).get("observedGeneration") == dd["metadata"]["generation"]
        return found if current and found.get("reason") == reason else None

    try:
        return wait_until(f"Degraded/{reason}", probe, timeout=PROMPT_S, interval=0.3)
    except TimeoutError as exc:
        status = get_dd(cluster, namespace, name).get("status")
        raise TimeoutError(f"{exc}\nlast status: {status}") from None


def test_more_efa_than_any_node_has_is_degraded_with_the_numbers_until_fixed(
    cluster: Cluster, operator: Any, namespace: str
) -> None:
    manifest = patched(example("minimal.yaml"), "spec.prefill.resources.efa", 16)
    manifest = patched(manifest, "spec.decode.resources.efa", 32)
    name = manifest["metadata"]["name"]
    apply(cluster, manifest, namespace)
    degraded = _degraded(cluster, namespace, name, "InsufficientCapacity")
    assert degraded["status"] == "True"
    assert re.fullmatch(
        r"decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is "
        r"16 \(\d+ nodes match\)",
        degraded["message"],
    ), degraded["message"]
    dd = get_dd(cluster, namespace, name)
    assert is_true(dd, "Stalled") and not is_true(dd, "Ready")
    apply(cluster, patched(manifest, "spec.decode.resources.efa", 16), namespace)
    ready = wait_ready(cluster, namespace, name)
    assert not is_true(ready, "Degraded"), condition(ready, "Degraded")


def test_more_hugepages_than_any_node_reserved_is_degraded_with_the_fix_until_fixed(
    cluster: Cluster, operator: Any, namespace: str
) -> None:
    manifest = patched(example("minimal.yaml"), "spec.decode.resources.hugepages2Mi", "80Gi")
    manifest = patched(manifest, "spec.decode.resources.memory", "8Gi")  # hugepages need it
    name = manifest["metadata"]["name"]
    apply(cluster, manifest, namespace)
    degraded = _degraded(cluster, namespace, name, "InsufficientCapacity")
    assert re.fullmatch(
        r"decode needs 81920Mi hugepages-2Mi per pod; the most any matching node offers is "
        r"65536Mi \(\d+ nodes match\): reserve 2 MiB hugepages on the nodes .* or lower "
        r"spec.decode.resources.hugepages2Mi",
        degraded["message"],
    ), degraded["message"]
    apply(cluster, patched(manifest, "spec.decode.resources.hugepages2Mi", "5120Mi"), namespace)
    ready = wait_ready(cluster, namespace, name)
    assert not is_true(ready, "Degraded"), condition(ready, "Degraded")


def test_a_node_selector_no_node_matches_is_unschedulable_with_the_schedulers_message(
    cluster: Cluster, operator: Any, namespace: str
) -> None:
    selector = {"node.kubernetes.io/instance-type": "p6-b200.48xlarge"}
    manifest = patched(example("minimal.yaml"), "spec.decode.nodeSelector", selector)
    name = manifest["metadata"]["name"]
    apply(cluster, manifest, namespace)
    degraded = _degraded(cluster, namespace, name, "Unschedulable")
    message = degraded["message"]
    assert message.startswith(f"decode: pod {name}-decode-0: 0/"), message
    assert "didn't match Pod's node affinity/selector" in message, message
    assert not is_true(get_dd(cluster, namespace, name), "Ready")
    fixed = {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
    apply(cluster, patched(manifest, "spec.decode.nodeSelector", fixed), namespace)
    ready = wait_ready(cluster, namespace, name)
    assert not is_true(ready, "Degraded"), condition(ready, "Degraded")
