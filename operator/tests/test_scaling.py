"""Per-role scaling: a role with `replicasFrom: Scaler` takes its replicas from its scaler only.

Reconciles run against the in-memory API of test_reconcile; the real scale subresource, HPA and
metrics API are proven end to end in e2e/test_autoscaling.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from test_reconcile import NOW, MemoryKube, body

from boomerang.operator import engines, scaler_api, scaling
from boomerang.operator.api import DisaggregatedDeployment
from boomerang.operator.reconcile import reconcile, refresh_status
from boomerang.operator.status import compute_status

SCALER = "DisaggregatedRoleScaler"


def scaled(replicas: int = 2) -> dict[str, Any]:
    data = body()
    data["spec"]["decode"].update(replicas=replicas, replicasFrom="Scaler")
    return data


def sts_replicas(kube: MemoryKube, name: str) -> int:
    return int(kube.objects[("StatefulSet", name)]["spec"]["replicas"])


def test_without_a_scaler_the_spec_owns_replicas_and_no_scaler_is_made() -> None:
    kube = MemoryKube(body())
    outcome = reconcile(kube.owner, kube, NOW)
    assert not [k for k in kube.objects if k[0] == SCALER]
    assert "scaler" not in outcome.status["decode"]


def test_first_reconcile_creates_the_scaler_seeded_from_the_spec() -> None:
    kube = MemoryKube(scaled(replicas=2))
    outcome = reconcile(kube.owner, kube, NOW)
    scaler = kube.objects[(SCALER, "minimal-decode")]
    assert scaler["spec"] == {"deploymentName": "minimal", "role": "decode", "replicas": 2}
    assert scaler["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert sts_replicas(kube, "minimal-decode") == 2
    assert (SCALER, "minimal-prefill") not in kube.objects  # prefill stays on its spec
    assert outcome.status["decode"]["scaler"] == "DisaggregatedRoleScaler/minimal-decode"
    assert scaler["status"] == {
        "replicas": 2,
        "readyReplicas": 0,
        "selector": "boomerang.dev/deployment=minimal,boomerang.dev/role=decode",
        "observedGeneration": 1,
    }


def test_a_scale_resizes_the_statefulset_only_and_the_scaler_is_never_reapplied() -> None:
    kube = MemoryKube(scaled(replicas=2))
    reconcile(kube.owner, kube, NOW)
    template = kube.objects[("StatefulSet", "minimal-decode")]["spec"]["template"]
    kube.objects[(SCALER, "minimal-decode")]["spec"]["replicas"] = 5  # an HPA's /scale write
    kube.objects[(SCALER, "minimal-decode")]["metadata"]["generation"] = 2
    outcome = reconcile(kube.owner, kube, NOW)
    assert sts_replicas(kube, "minimal-decode") == 5
    assert kube.objects[("StatefulSet", "minimal-decode")]["spec"]["template"] == template
    assert kube.applied.count((SCALER, "minimal-decode")) == 1  # create-only
    assert kube.owner["spec"]["decode"]["replicas"] == 2  # the parent's spec is untouched
    assert outcome.status["decode"]["desired"] == 5
    assert kube.objects[(SCALER, "minimal-decode")]["status"]["observedGeneration"] == 2


def test_a_deleted_scaler_is_recreated_at_the_role_s_live_size() -> None:
    kube = MemoryKube(scaled(replicas=2))
    reconcile(kube.owner, kube, NOW)
    kube.objects[(SCALER, "minimal-decode")]["spec"]["replicas"] = 4
    reconcile(kube.owner, kube, NOW)
    del kube.objects[(SCALER, "minimal-decode")]
    reconcile(kube.owner, kube, NOW)
    assert kube.objects[(SCALER, "minimal-decode")]["spec"]["replicas"] == 4
    assert sts_replicas(kube, "minimal-decode") == 4


def test_a_status_refresh_reads_the_scaler_but_never_creates_one() -> None:
    kube = MemoryKube(scaled(replicas=3))
    kube.objects[("StatefulSet", "minimal-decode")] = {
        "kind": "StatefulSet",
        "metadata": {"name": "minimal-decode", "generation": 1},
        "spec": {"replicas": 3},
    }
    outcome = refresh_status(kube.owner, kube, NOW)
    assert (SCALER, "minimal-decode") not in kube.objects
    assert outcome.status["decode"]["desired"] == 3


def test_scaling_changes_no_pod_template() -> None:
    dd = DisaggregatedDeployment.model_validate(scaled(replicas=1))
    bigger = scaling.effective(dd, {"decode": 7})
    assert bigger.spec.decode.replicas == 7 and dd.spec.decode.replicas == 1
    assert engines.config_hash(bigger, "decode") == engines.config_hash(dd, "decode")
    assert scaling.effective(dd, {}) is dd


@pytest.mark.parametrize(
    ("generation", "observed", "expected"),
    [(2, 2, None), (3, 2, ("team-a", "minimal")), (1, None, ("team-a", "minimal"))],
)
def test_a_scaler_event_converges_only_after_a_spec_change(
    generation: int, observed: int | None, expected: tuple[str, str] | None
) -> None:
    obj: dict[str, Any] = {
        "metadata": {"namespace": "team-a", "name": "minimal-decode", "generation": generation},
        "spec": {"deploymentName": "minimal", "role": "decode", "replicas": 2},
    }
    if observed is not None:
        obj["status"] = {"observedGeneration": observed}
    assert scaling.owner_of(obj) == expected


def test_the_scaler_model_rejects_what_the_crd_rejects_naming_the_field() -> None:
    spec = {"deploymentName": "minimal", "role": "decode", "replicas": 0}
    with pytest.raises(ValidationError, match="replicas"):
        scaler_api.DisaggregatedRoleScalerSpec.model_validate(spec)
    with pytest.raises(ValidationError, match="role"):
        scaler_api.DisaggregatedRoleScalerSpec.model_validate({**spec, "role": "router"})
    ok = scaler_api.DisaggregatedRoleScaler.model_validate(
        {"metadata": {"name": "other"}, "spec": {**spec, "replicas": 1}}
    )
    assert [r.check(ok) for r in scaler_api.NAME_RULES] == [False]


def test_a_scale_up_at_the_same_generation_is_progress_not_a_fault() -> None:
    dd = scaling.effective(DisaggregatedDeployment.model_validate(scaled(replicas=1)), {})
    ready = {"observedGeneration": 1, "readyReplicas": 1, "updatedReplicas": 1, "replicas": 1,
             "currentRevision": "r", "updateRevision": "r"}  # fmt: skip

    def sts(replicas: int, status: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "StatefulSet", "metadata": {"generation": 1},
                "spec": {"replicas": replicas}, "status": status}  # fmt: skip

    routed = {"observedGeneration": 1, "readyReplicas": 2, "updatedReplicas": 2}
    router = {"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"replicas": 2},
              "status": routed}  # fmt: skip
    observed = {"prefill": sts(1, ready), "decode": sts(1, ready), "router": router}
    first = compute_status(dd, observed, None, NOW)
    assert first["readyGeneration"] == 1
    grown = scaling.effective(dd, {"decode": 3})
    observed["decode"] = sts(3, {**ready, "replicas": 3, "updatedReplicas": 3})
    previous = first
    for _ in range(2):  # the first status after the scale, and the next refresh
        status = compute_status(grown, observed, previous, NOW)
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "False", degraded
        previous = status
