"""Why pods are not ready: the most specific reason, from realistic pod JSON."""

from __future__ import annotations

from typing import Any

import pytest

from boomerang.operator.pods import MESSAGE_MAX, Finding, diagnose

SCHEDULER_EFA = (
    "0/4 nodes are available: 4 Insufficient vpc.amazonaws.com/efa. preemption: 0/4 nodes are "
    "available: 4 No preemption victims found for incoming pod."
)
SCHEDULER_CORDONED = (
    "0/4 nodes are available: 4 node(s) were unschedulable. preemption: 0/4 nodes are "
    "available: 4 Preemption is not helpful for scheduling."
)


def pod(
    name: str = "qwen-decode-0",
    *,
    scheduled: dict[str, Any] | None = None,
    containers: list[dict[str, Any]] | None = None,
    ready: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    """A pod as the API server returns it, with only the fields that matter here."""
    conditions = [
        scheduled or {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False", "reason": "ContainersNotReady"},
    ]
    meta: dict[str, Any] = {"name": name, "namespace": "team-a"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "resources": {"limits": {"memory": "64Gi", "nvidia.com/gpu": "1"}},
                }
            ]
        },
        "status": {
            "phase": "Running" if containers else "Pending",
            "conditions": conditions,
            "containerStatuses": containers or [],
        },
    }


def unschedulable(message: str) -> dict[str, Any]:
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip


def container(
    state: dict[str, Any],
    *,
    restarts: int = 0,
    last: dict[str, Any] | None = None,
    started: bool | None = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": "engine",
        "image": "ghcr.io/boomerang/engine:0.1",
        "imageID": "",
        "ready": False,
        "restartCount": restarts,
        "state": state,
        "lastState": last or {},
    }
    if started is not None:
        status["started"] = started
    return status


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


RUNNING = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
OOM = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-01-01T00:01:00Z"}}
ERROR = {"terminated": {"reason": "Error", "exitCode": 1}}
MR_FAILED = (  # what the engine's entrypoint writes (connector/entrypoint.py)
    "EFAMemoryRegistrationFailed: E1204 libfabric_rail.cpp:1234] fi_mr_reg failed on rail 3: "
    "Permission denied; fix: set spec.efa.privileged: true"
)
MR_LOG_TAIL = "...\nE1204 libfabric_rail.cpp:1234] fi_mr_reg failed on rail 0: Bad address\n..."
EFA_FIX = (
    "set spec.efa.privileged: true (registering GPU memory with the EFA NIC may need a "
    "privileged container, e.g. for /dev/gdrdrv; docs/eks.md, Privileged EFA pods)"
)

CASES: list[tuple[str, list[dict[str, Any]], tuple[str, str, bool] | None]] = [
    ("no pods", [], None),
    (
        "EFA memory registration failed: the entrypoint's message, before the crash loop",
        [
            pod(
                containers=[
                    container(
                        waiting("CrashLoopBackOff"),
                        restarts=4,
                        last={
                            "terminated": {"reason": "Error", "exitCode": 1, "message": MR_FAILED}
                        },
                    )
                ]
            )
        ],
        (
            "EFAMemoryRegistrationFailed",
            "pod qwen-decode-0 container engine: NIXL could not register memory with the EFA NIC "
            f"(fi_mr_reg), 4 restarts; {EFA_FIX}",
            True,
        ),
    ),
    (
        "EFA memory registration failed: found in the log's tail (FallbackToLogsOnError)",
        [
            pod(
                containers=[
                    container(
                        {"terminated": {"reason": "Error", "exitCode": 1, "message": MR_LOG_TAIL}}
                    )
                ]
            )
        ],
        (
            "EFAMemoryRegistrationFailed",
            "pod qwen-decode-0 container engine: NIXL could not register memory with the EFA NIC "
            f"(fi_mr_reg), 0 restarts; {EFA_FIX}",
            True,
        ),
    ),
    ("ready pod", [pod(ready=True, containers=[container(RUNNING, started=True)])], None),
    (
        "unschedulable: the scheduler's message kept",
        [pod(scheduled=unschedulable(SCHEDULER_EFA))],
        ("Unschedulable", f"pod qwen-decode-0: {SCHEDULER_EFA}", True),
    ),
    (
        "pending on cordoned nodes only: may pass",
        [pod(scheduled=unschedulable(SCHEDULER_CORDONED))],
        ("Pending", f"pod qwen-decode-0: {SCHEDULER_CORDONED}", False),
    ),
    (
        "image pull back-off",
        [pod(containers=[container(waiting("ImagePullBackOff", 'Back-off pulling image "x:1"'))])],
        (
            "ImagePullFailed",
            'pod qwen-decode-0 container engine: ImagePullBackOff: Back-off pulling image "x:1"',
            True,
        ),
    ),
    (
        "err image pull without a message",
        [pod(containers=[container(waiting("ErrImagePull"))])],
        (
            "ImagePullFailed",
            "pod qwen-decode-0 container engine: ErrImagePull: cannot pull "
            "image ghcr.io/boomerang/engine:0.1",
            True,
        ),
    ),
    (
        "invalid image name",
        [pod(containers=[container(waiting("InvalidImageName", "couldn't parse image"))])],
        (
            "ImagePullFailed",
            "pod qwen-decode-0 container engine: InvalidImageName: couldn't parse image",
            True,
        ),
    ),
    (
        "never pull",
        [pod(containers=[container(waiting("ErrImageNeverPull", "image not present"))])],
        (
            "ImagePullFailed",
            "pod qwen-decode-0 container engine: ErrImageNeverPull: image not present",
            True,
        ),
    ),
    (
        "crash loop",
        [
            pod(
                containers=[
                    container(waiting("CrashLoopBackOff", "back-off 5m0s"), restarts=7, last=ERROR)
                ]
            )
        ],
        (
            "CrashLoopBackOff",
            "pod qwen-decode-0 container engine is crash-looping (7 restarts, last exit code 1)",
            True,
        ),
    ),
    (
        "OOM-killed, in back-off: the OOM kill is the more specific",
        [pod(containers=[container(waiting("CrashLoopBackOff"), restarts=3, last=OOM)])],
        (
            "OOMKilled",
            "pod qwen-decode-0 container engine was OOM-killed (memory limit 64Gi), 3 restarts",
            True,
        ),
    ),
    (
        "OOM-killed just now",
        [pod(containers=[container(OOM, restarts=0)])],
        (
            "OOMKilled",
            "pod qwen-decode-0 container engine was OOM-killed (memory limit 64Gi), 0 restarts",
            True,
        ),
    ),
    (
        "startup probe not passed yet",
        [pod(containers=[container(RUNNING, restarts=1, started=False)])],
        (
            "StartupProbeFailing",
            "pod qwen-decode-0 container engine has not passed its startup probe yet (1 restarts)",
            False,
        ),
    ),
    (
        "started but not ready: readiness only",
        [pod(containers=[container(RUNNING, started=True)])],
        None,
    ),
    ("creating", [pod(containers=[container(waiting("ContainerCreating"))])], None),
    (
        "a terminating pod is not judged",
        [pod(deleting=True, containers=[container(waiting("CrashLoopBackOff"))])],
        None,
    ),
    (
        "most specific across pods: unschedulable beats a crash loop",
        [
            pod("qwen-decode-0", containers=[container(waiting("CrashLoopBackOff"), last=ERROR)]),
            pod("qwen-decode-1", scheduled=unschedulable(SCHEDULER_EFA)),
        ],
        ("Unschedulable", f"pod qwen-decode-1: {SCHEDULER_EFA}", True),
    ),
]


@pytest.mark.parametrize(("pods", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_most_specific_reason_a_pod_is_not_ready(
    pods: list[dict[str, Any]], expected: tuple[str, str, bool] | None
) -> None:
    assert diagnose(pods) == (Finding(*expected) if expected else None)


def test_a_long_scheduler_message_is_trimmed_to_one_line() -> None:
    long = "0/900 nodes are available:\n" + "; ".join(f"{i} Insufficient cpu" for i in range(200))
    finding = diagnose([pod(scheduled=unschedulable(long))])
    assert finding is not None and len(finding.message) == MESSAGE_MAX
    assert "\n" not in finding.message and finding.message.endswith("...")
