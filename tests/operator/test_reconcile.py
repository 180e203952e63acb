"""The reconciler against an in-memory API double: idempotent, level-based, honest status."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dd_testing import manifest

from boomerang.operator.kube import KubeError
from boomerang.operator.reconcile import reconcile, refresh_status

NOW = "2026-01-01T00:00:00Z"


class MemoryKube:
    """Stores applied objects; workloads report all replicas ready once `ready` is set."""

    def __init__(self, fail_kind: str | None = None) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.status_writes: list[dict[str, Any]] = []
        self.fail_kind = fail_kind
        self.ready = False

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        if obj["kind"] == self.fail_kind:
            raise KubeError("admission webhook denied the request", 403)
        stored = copy.deepcopy(dict(obj))
        stored["metadata"]["generation"] = 1
        self.objects[(obj["kind"], obj["metadata"]["name"])] = stored
        return self._with_status(stored)

    def _with_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            n = obj["spec"]["replicas"] if self.ready else 0
            obj = {**obj, "status": {"observedGeneration": 1, "readyReplicas": n,
                                     "updatedReplicas": n, "currentRevision": "r",
                                     "updateRevision": "r"}}  # fmt: skip
        return obj

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, name))
        return self._with_status(obj) if obj else None

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status_writes.append(copy.deepcopy(dict(status)))


def body(status: dict[str, Any] | None = None) -> dict[str, Any]:
    data = manifest("minimal")
    data["metadata"].update(namespace="team-a", uid="u-1", generation=1)
    if status is not None:
        data["status"] = status
    return data


def test_first_reconcile_applies_every_child_and_reports_progress() -> None:
    kube = MemoryKube()
    outcome = reconcile(body(), kube, NOW)
    kinds = sorted(kind for kind, _ in kube.objects)
    assert kinds.count("StatefulSet") == 2 and kinds.count("PodDisruptionBudget") == 3
    assert len(kube.objects) == 14
    assert outcome.written and len(kube.status_writes) == 1
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"


def test_reconcile_is_idempotent_and_does_not_rewrite_unchanged_status() -> None:
    kube = MemoryKube()
    kube.ready = True
    first = reconcile(body(), kube, NOW)
    second = reconcile(body(first.status), kube, "2026-01-01T00:05:00Z")
    assert not second.written
    assert second.events == []
    assert len(kube.status_writes) == 1


def test_deleted_child_is_recreated_by_the_next_reconcile() -> None:
    kube = MemoryKube()
    reconcile(body(), kube, NOW)
    del kube.objects[("StatefulSet", "minimal-decode")]
    reconcile(body(), kube, NOW)
    assert ("StatefulSet", "minimal-decode") in kube.objects


def test_workload_readiness_flows_into_status_without_applying() -> None:
    kube = MemoryKube()
    first = reconcile(body(), kube, NOW)
    kube.ready = True
    applied_before = dict(kube.objects)
    outcome = refresh_status(body(first.status), kube, NOW)
    assert kube.objects == applied_before
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert ("Normal", "AllReplicasReady") in [(e[0], e[1]) for e in outcome.events]


def test_a_failing_child_degrades_status_and_the_rest_still_apply() -> None:
    kube = MemoryKube(fail_kind="NetworkPolicy")
    outcome = reconcile(body(), kube, NOW)
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "NetworkPolicy" in degraded["message"]
    assert ("StatefulSet", "minimal-prefill") in kube.objects
    assert any(kind == "Warning" for kind, _, _ in outcome.events)


def test_invalid_spec_is_reported_in_status_not_raised() -> None:
    kube = MemoryKube()
    bad = body()
    bad["spec"]["kvTransfer"] = {"recomputeThreshold": -5}
    outcome = reconcile(bad, kube, NOW)
    assert kube.objects == {}
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "recomputeThreshold" in degraded["message"]
