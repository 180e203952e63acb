"""Status: counts, the three conditions, no flapping, revision skew, why not Ready."""

from __future__ import annotations

from typing import Any

import pytest
from dd_testing import deployment

from boomerang.operator.api import DisaggregatedDeploymentStatus
from boomerang.operator.pods import Finding
from boomerang.operator.render import ANNOTATION_ENGINE_REVISION
from boomerang.operator.status import Diagnosis, compute_status, condition_changes, invalid_status

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def sts(
    replicas: int,
    ready: int,
    updated: int | None = None,
    skewed: bool = False,
    partition: int = 0,
    revision: str = "e1",
    observed: int = 2,
) -> dict[str, Any]:
    """A StatefulSet at generation 2 whose template carries engine revision `revision`."""
    return {
        "kind": "StatefulSet",
        "metadata": {"generation": 2},
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
            "currentRevision": "a",
            "updateRevision": "b" if skewed else "a",
        },
        "spec": {
            "replicas": replicas,
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
            "template": {"metadata": {"annotations": {ANNOTATION_ENGINE_REVISION: revision}}},
        },
    }


def pod(revision: str, leaving: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": {ANNOTATION_ENGINE_REVISION: revision}}
    if leaving:
        meta["deletionTimestamp"] = T0
    return {"metadata": meta}


def deploy(replicas: int, ready: int) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"generation": 1},
        "status": {"observedGeneration": 1, "readyReplicas": ready, "updatedReplicas": replicas},
    }


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def ready_world() -> dict[str, Any]:
    return {"prefill": sts(1, 1), "decode": sts(1, 1), "router": deploy(2, 2)}


def test_nothing_created_yet_is_progressing_not_ready() -> None:
    status = compute_status(deployment(generation=1), {}, None, T0)
    assert conditions(status)["Ready"] == ("False", "WaitingForReplicas")
    assert conditions(status)["Progressing"][0] == "True"
    assert conditions(status)["Degraded"] == ("False", "AsExpected")
    assert status["observedGeneration"] == 1


def test_all_replicas_ready_is_ready_and_stable() -> None:
    status = compute_status(deployment(generation=2), ready_world(), None, T0)
    assert conditions(status) == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "Stable"),
        "Degraded": ("False", "AsExpected"),
        "Reconciling": ("False", "Stable"),
        "Stalled": ("False", "AsExpected"),
    }
    assert status["prefill"] == {"desired": 1, "ready": 1, "updated": 1}
    assert status["router"]["url"] == "http://minimal-router.default.svc:80/v1"
    assert status["kvTransfer"]["decoderBlocksTTLSeconds"] == 480
    assert status["kvTransfer"]["backend"] == "UCX"


def test_recomputing_an_unchanged_world_changes_nothing() -> None:
    dd = deployment(generation=2)
    first = compute_status(dd, ready_world(), None, T0)
    again = compute_status(dd, ready_world(), first, T1)
    assert again == first
    assert condition_changes(first, again) == []


def test_transition_time_moves_only_when_status_changes() -> None:
    dd = deployment(generation=2)
    first = compute_status(dd, {}, None, T0)
    second = compute_status(dd, ready_world(), first, T1)
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert times == {
        "Ready": T1,
        "Progressing": T1,
        "Degraded": T0,
        "Reconciling": T1,
        "Stalled": T0,
    }


def test_losing_replicas_after_ready_is_degraded() -> None:
    dd = deployment(generation=2)
    ready = compute_status(dd, ready_world(), None, T0)
    world = {**ready_world(), "decode": sts(1, 0)}
    status = compute_status(dd, world, ready, T1)
    assert conditions(status)["Degraded"] == ("True", "ReplicasUnavailable")
    assert conditions(status)["Ready"][0] == "False"


def test_pods_lost_through_a_transient_state_are_still_degraded() -> None:
    """Deleted pods first show as not yet updated (the StatefulSet catching up), then settle
    Pending: the spec was Ready at this generation, so the settled state is a fault."""
    dd = deployment(generation=2)
    ready = compute_status(dd, ready_world(), None, T0)
    transient = compute_status(dd, {**ready_world(), "decode": sts(1, 0, updated=0)}, ready, T1)
    assert conditions(transient)["Progressing"] == ("True", "RollingOut")
    settled = compute_status(dd, {**ready_world(), "decode": sts(1, 0)}, transient, T1)
    assert conditions(settled)["Degraded"] == ("True", "ReplicasUnavailable")
    assert settled["readyGeneration"] == 2


def test_scale_up_first_seen_with_pods_pending_is_progressing_not_degraded() -> None:
    """The operator may first look after the StatefulSet settled (its new pods created but not
    ready): the spec change explains the missing replicas, so this is no fault."""
    ready = compute_status(deployment(generation=2), ready_world(), None, T0)
    dd = deployment("minimal", {"decode": {"replicas": 3}}, generation=3)
    world = {**ready_world(), "decode": sts(3, 1)}
    status = compute_status(dd, world, ready, T1)
    assert conditions(status)["Progressing"] == ("True", "WaitingForReplicas")
    assert conditions(status)["Degraded"] == ("False", "AsExpected")
    assert conditions(status)["Ready"][0] == "False"


def test_half_rolled_role_reports_revision_skew() -> None:
    dd = deployment("minimal", {"decode": {"replicas": 2}}, generation=2)
    world = {**ready_world(), "decode": sts(2, 2, updated=1, skewed=True, revision="e2")}
    status = compute_status(dd, world, None, T0, pods={"decode": [pod("e2"), pod("e1")]})
    assert status["revisionSkew"] is True
    assert conditions(status)["Progressing"] == ("True", "RevisionSkew")


Role = tuple[dict[str, Any], list[dict[str, Any]] | None]


def rolled(revision: str, replicas: int = 1) -> Role:
    """Every pod on the template's engine revision (pods not read: the StatefulSet says it)."""
    return sts(replicas, replicas, revision=revision), None


def rolling(template: str, running: list[str], partition: int = 0, ready: int = 1) -> Role:
    """An update pending: the template names `template`, the pods run `running` (a
    `partition` holds every pod back: none updated)."""
    replicas = len(running)
    updated = 0 if partition else running.count(template)
    state = sts(replicas, ready, updated, skewed=True, partition=partition, revision=template)
    return state, [pod(r) for r in running]


@pytest.mark.parametrize(
    ("prefill", "decode", "skew"),
    [
        (rolled("e1"), rolled("e1"), False),
        # The staged rollout: prefill on the new engine, decode held on the old one.
        (rolled("e2"), rolling("e2", ["e1"], partition=1), True),
        # Prefill's new pod not ready yet, decode's old one still serving: a different build.
        (rolling("e2", ["e2"], ready=0), rolling("e2", ["e1"], partition=1), True),
        # The reverse: decode rolled, prefill not.
        (rolling("e2", ["e1"]), rolled("e2"), True),
        # A change that leaves the engine alone (a kv-transfer setting) rolls no skew.
        (rolled("e1"), rolling("e1", ["e1"], partition=1), False),
        # One role part-way, the other with no pods at all.
        (rolling("e2", ["e2", "e1"]), (sts(0, 0, revision="e1"), None), True),
        # A pod on its way out runs nothing any more.
        ((sts(2, 2, 1, True, revision="e2"), [pod("e2"), pod("e1", leaving=True)]),
         rolled("e2"), False),
        # The controller has not seen the new template yet: the pods say what runs.
        ((sts(1, 1, revision="e2", observed=1), [pod("e1")]), rolled("e1"), False),
        # Pods of an older operator carry no revision: unknown, not a skew.
        ((sts(1, 1, 0, True, revision="e2"), [{"metadata": {}}]), rolled("e2"), False),
    ],
    ids=[
        "both-rolled", "prefill-rolled-decode-held", "prefill-starting-decode-held",
        "decode-rolled-prefill-not", "same-engine-decode-held", "part-way-beside-none",
        "leaving-pod", "controller-behind", "unannotated-pods",
    ],
)  # fmt: skip
def test_revision_skew_compares_the_engine_revisions_the_pods_of_both_roles_run(
    prefill: Role, decode: Role, skew: bool
) -> None:
    dd = deployment(generation=2)
    world = {"prefill": prefill[0], "decode": decode[0], "router": deploy(2, 2)}
    read = {role: pods_ for role, (_, pods_) in (("prefill", prefill), ("decode", decode))}
    status = compute_status(dd, world, None, T0, pods={k: v for k, v in read.items() if v})
    assert status["revisionSkew"] is skew
    assert (conditions(status)["Progressing"][1] == "RevisionSkew") is skew


def progressing_message(status: dict[str, Any]) -> str:
    return str(next(c["message"] for c in status["conditions"] if c["type"] == "Progressing"))


def test_a_held_decode_says_it_waits_for_prefill() -> None:
    """Prefill's new pod is starting; decode's old pod serves, its rollout held back."""
    dd = deployment(generation=3)
    ready = compute_status(deployment(generation=2), ready_world(), None, T0)
    world = {
        **ready_world(),
        "prefill": sts(1, 0, updated=0, skewed=True),
        "decode": sts(1, 1, updated=0, skewed=True, partition=1),
    }
    status = compute_status(dd, world, ready, T1)
    assert conditions(status)["Progressing"] == ("True", "RollingOut")
    assert conditions(status)["Reconciling"] == ("True", "RollingOut")
    assert progressing_message(status) == (
        "updating prefill, decode (waits for prefill to roll out first)"
    )
    assert conditions(status)["Ready"][0] == "False"
    assert conditions(status)["Degraded"] == ("False", "AsExpected")
    released = {**world, "prefill": sts(1, 1), "decode": sts(1, 1, updated=0, skewed=True)}
    status = compute_status(dd, released, status, T1)
    assert progressing_message(status) == "updating decode"


def test_a_partition_with_nothing_to_hold_back_is_not_reported() -> None:
    world = {**ready_world(), "decode": sts(1, 1, partition=1)}
    status = compute_status(deployment(generation=2), world, None, T0)
    assert conditions(status)["Progressing"] == ("False", "Stable")
    assert conditions(status)["Ready"] == ("True", "AllReplicasReady")


def test_reconcile_error_is_degraded_with_its_message() -> None:
    status = compute_status(deployment(generation=2), ready_world(), None, T0, error="quota")
    assert conditions(status)["Degraded"] == ("True", "ReconcileFailed")
    assert "quota" in next(c["message"] for c in status["conditions"] if c["type"] == "Degraded")


@pytest.mark.parametrize("world", ["pending", "ready", "lost", "failed", "stuck"])
def test_kstatus_conditions_mirror_progressing_and_degraded(world) -> None:
    """Flux and other kstatus readers see exactly what Progressing and Degraded say."""
    dd = deployment(generation=2)
    ready = compute_status(dd, ready_world(), None, T0)
    status = {
        "pending": lambda: compute_status(dd, {}, None, T0),
        "ready": lambda: ready,
        "lost": lambda: compute_status(dd, {}, ready, T1),
        "failed": lambda: compute_status(dd, ready_world(), None, T0, error="quota"),
        "stuck": lambda: compute_status(
            dd, {}, None, T0, diagnosis=Diagnosis(pods={"decode": UNSCHEDULABLE})
        ),
    }[world]()
    found = conditions(status)
    assert found["Reconciling"] == found["Progressing"]
    assert found["Stalled"] == found["Degraded"]


def degraded(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Degraded")


UNSCHEDULABLE = Finding("Unschedulable", "pod minimal-decode-0: 0/4 nodes are available", True)
STARTING = Finding("StartupProbeFailing", "pod minimal-decode-0 has not started yet", False)


def test_pods_that_cannot_run_are_degraded_with_their_reason_and_message() -> None:
    world = {**ready_world(), "decode": sts(1, 0)}
    found = Diagnosis(pods={"decode": UNSCHEDULABLE})
    status = compute_status(deployment(generation=2), world, None, T0, diagnosis=found)
    assert conditions(status)["Degraded"] == ("True", "Unschedulable")
    assert conditions(status)["Stalled"] == ("True", "Unschedulable")
    assert degraded(status)["message"] == "decode: pod minimal-decode-0: 0/4 nodes are available"
    assert conditions(status)["Progressing"][0] == "True"


def test_a_reason_that_may_pass_is_progress_not_a_fault() -> None:
    world = {**ready_world(), "decode": sts(1, 0)}
    status = compute_status(
        deployment(generation=2), world, None, T0, diagnosis=Diagnosis(pods={"decode": STARTING})
    )
    assert conditions(status)["Degraded"] == ("False", "AsExpected")
    assert progressing_message(status) == (
        "decode 0/1 ready (pod minimal-decode-0 has not started yet)"
    )


def test_findings_on_a_ready_component_are_ignored() -> None:
    found = Diagnosis(pods={"decode": UNSCHEDULABLE}, capacity={"decode": "decode needs 32"})
    status = compute_status(deployment(generation=2), ready_world(), None, T0, diagnosis=found)
    assert conditions(status)["Degraded"] == ("False", "AsExpected")


def test_insufficient_capacity_comes_before_the_pods_and_a_failure_before_both() -> None:
    world = {**ready_world(), "decode": sts(1, 0)}
    found = Diagnosis(pods={"decode": UNSCHEDULABLE}, capacity={"decode": "decode needs 32 efa"})
    status = compute_status(deployment(generation=2), world, None, T0, diagnosis=found)
    assert conditions(status)["Degraded"] == ("True", "InsufficientCapacity")
    assert degraded(status)["message"] == "decode needs 32 efa"
    failed = compute_status(deployment(generation=2), world, None, T0, "quota", found)
    assert conditions(failed)["Degraded"] == ("True", "ReconcileFailed")


def at(minutes: int) -> str:
    return f"2026-01-01T{minutes // 60:02d}:{minutes % 60:02d}:00Z"


def test_no_progress_past_the_deadline_is_degraded() -> None:
    dd = deployment(generation=2)
    pending = {**ready_world(), "decode": sts(1, 0)}
    first = compute_status(dd, pending, None, at(0))
    assert conditions(compute_status(dd, pending, first, at(29)))["Degraded"][0] == "False"
    late = compute_status(dd, pending, first, at(31))
    assert conditions(late)["Degraded"] == ("True", "ProgressDeadlineExceeded")
    assert degraded(late)["message"] == (
        "no replica became ready or updated in 30m: decode 0/1 ready"
    )
    assert conditions(late)["Progressing"] == ("True", "WaitingForReplicas")
    assert conditions(compute_status(dd, ready_world(), late, at(32)))["Degraded"][0] == "False"


def test_a_replica_becoming_ready_or_a_new_generation_restarts_the_deadline() -> None:
    dd = deployment("minimal", {"decode": {"replicas": 3}}, generation=2)
    first = compute_status(dd, {**ready_world(), "decode": sts(3, 0)}, None, at(0))
    moved = compute_status(dd, {**ready_world(), "decode": sts(3, 1)}, first, at(20))
    late = compute_status(dd, {**ready_world(), "decode": sts(3, 1)}, moved, at(45))
    assert conditions(late)["Degraded"] == ("False", "AsExpected")
    since = {c["type"]: c["lastTransitionTime"] for c in late["conditions"]}
    assert since["Progressing"] == since["Reconciling"] == at(20)
    changed = deployment("minimal", {"decode": {"replicas": 4}}, generation=3)
    later = compute_status(changed, {**ready_world(), "decode": sts(4, 1)}, late, at(55))
    assert conditions(later)["Degraded"] == ("False", "AsExpected")
    assert next(c for c in later["conditions"] if c["type"] == "Progressing")[
        "lastTransitionTime"
    ] == at(55)


@pytest.mark.parametrize("world", ["pending", "ready", "failed"])
def test_status_is_exactly_the_status_model_of_the_api(world: str) -> None:
    """Every field written is one the CRD declares, under its declared name."""
    dd = deployment(generation=2)
    ready = compute_status(dd, ready_world(), None, T0)
    status = {
        "pending": lambda: compute_status(dd, {}, None, T0),
        "ready": lambda: ready,
        "failed": lambda: compute_status(dd, ready_world(), ready, T1, error="quota"),
    }[world]()
    model = DisaggregatedDeploymentStatus.model_validate(status)
    assert model.model_dump(by_alias=True, exclude_none=True) == status


def test_an_invalid_spec_status_changes_only_the_conditions_and_stays_put() -> None:
    ready = compute_status(deployment(generation=2), ready_world(), None, T0)
    invalid = invalid_status(3, "spec.x: bad", ready, T1)
    assert set(invalid) == {"observedGeneration", "conditions"}
    assert conditions(invalid) == {
        "Ready": ("False", "InvalidSpec"),
        "Progressing": ("False", "InvalidSpec"),
        "Degraded": ("True", "InvalidSpec"),
        "Reconciling": ("False", "InvalidSpec"),
        "Stalled": ("True", "InvalidSpec"),
    }
    since = {c["type"]: c["lastTransitionTime"] for c in invalid["conditions"]}
    assert since == {"Ready": T1, "Progressing": T0, "Degraded": T1, "Reconciling": T0,
                     "Stalled": T1}  # fmt: skip
    assert invalid_status(3, "spec.x: bad", {**ready, **invalid}, "2026-01-01T00:09:00Z") == (
        invalid
    )
    DisaggregatedDeploymentStatus.model_validate(invalid)
