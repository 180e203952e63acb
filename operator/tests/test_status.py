"""Status: counts, the three conditions, no flapping, revision skew, why not Ready."""

from __future__ import annotations

from typing import Any

import pytest
from dd_testing import deployment

from boomerang.operator.pods import Finding
from boomerang.operator.status import Diagnosis, compute_status, condition_changes

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def sts(
    replicas: int, ready: int, updated: int | None = None, skewed: bool = False, partition: int = 0
) -> dict[str, Any]:
    return {
        "kind": "StatefulSet",
        "metadata": {"generation": 2},
        "status": {
            "observedGeneration": 2,
            "readyReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
            "currentRevision": "a",
            "updateRevision": "b" if skewed else "a",
        },
        "spec": {
            "replicas": replicas,
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
        },
    }


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
    world = {**ready_world(), "decode": sts(2, 2, updated=1, skewed=True)}
    status = compute_status(dd, world, None, T0)
    assert status["revisionSkew"] is True
    assert conditions(status)["Progressing"] == ("True", "RevisionSkew")


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
