"""Why a component's pods are not ready, read from the pods themselves: a pure function.

A StatefulSet's status says only how many pods are ready, so a resource whose pods can never
run would look like a rollout under way forever. The pods say why: the scheduler's
`PodScheduled=False/Unschedulable` condition (its message names the resource no node has), a
container waiting on its image or in a crash loop, a container killed for its memory, a
startup probe not yet passed. `diagnose` turns a component's pods into the most specific of
these, and whether it will fix itself: a pod that cannot be scheduled, pulled or started stays
so until someone changes something (status says Degraded); a startup probe still failing, or a
pod pending only because nodes are cordoned, may pass on its own (status says Progressing).

An engine that failed for a reason the resource must fix says so in its termination message
(the entrypoint writes it; the log's tail stands in otherwise): NIXL failing to register memory
with the EFA NIC (`fi_mr_reg`) is `EFAMemoryRegistrationFailed`, with its fix.

Startup probes are read from `started: false` and restart counts rather than from the pods'
`Unhealthy` events: that would be one more list per pod on every refresh, and a startup probe
failing is normal for minutes while an engine loads its model, so it never degrades status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from boomerang.connector.config import (
    EFA_REGISTRATION_FAILED,
    EFA_REGISTRATION_FIX,
    EFA_REGISTRATION_LOG,
)

MESSAGE_MAX = 300
"""A pod's message is cut to this: the scheduler's can list every node group."""

IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
)
PRIORITY = (
    "Unschedulable",
    "ImagePullFailed",
    EFA_REGISTRATION_FAILED,
    "OOMKilled",
    "CrashLoopBackOff",
    "StartupProbeFailing",
    "Pending",
)
"""Reasons, most specific first: the first any pod shows is the component's reason."""


@dataclass(frozen=True)
class Finding:
    """Why a pod is not ready: a CamelCase reason, a message, and whether it is stuck."""

    reason: str
    message: str
    stuck: bool  # will not fix itself without a change: Degraded, not just Progressing


def diagnose(pods: Sequence[Mapping[str, Any]]) -> Finding | None:
    """The most specific reason any of these pods is not ready (None: no reason found)."""
    found = [f for pod in sorted(pods, key=_name) if (f := _pod_finding(pod)) is not None]
    if not found:
        return None
    return min(found, key=lambda f: PRIORITY.index(f.reason))


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod.get("metadata", {}).get("name", ""))


def _trim(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 3] + "..."


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def _pod_finding(pod: Mapping[str, Any]) -> Finding | None:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return None  # going away: its replacement is the one to judge
    if _condition(pod, "Ready").get("status") == "True":
        return None
    scheduled = _condition(pod, "PodScheduled")
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        message = str(scheduled.get("message") or "no node fits the pod")
        # Cordoned nodes come back (a drain, an upgrade): pending on them alone is no fault.
        stuck = "were unschedulable" not in message
        reason = "Unschedulable" if stuck else "Pending"
        return Finding(reason, _trim(f"pod {_name(pod)}: {message}"), stuck)
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    found = [f for c in statuses if (f := _container_finding(pod, c)) is not None]
    return min(found, key=lambda f: PRIORITY.index(f.reason)) if found else None


def _container_finding(pod: Mapping[str, Any], status: Mapping[str, Any]) -> Finding | None:
    where = f"pod {_name(pod)} container {status.get('name')}"
    waiting = (status.get("state") or {}).get("waiting") or {}
    reason = waiting.get("reason")
    restarts = int(status.get("restartCount") or 0)
    if reason in IMAGE_PULL_REASONS:
        detail = waiting.get("message") or f"cannot pull image {status.get('image')}"
        return Finding("ImagePullFailed", _trim(f"{where}: {reason}: {detail}"), stuck=True)
    terminated = _terminated(status)
    said = str(terminated.get("message") or "")
    if EFA_REGISTRATION_FAILED in said or EFA_REGISTRATION_LOG.search(said):
        message = (
            f"{where}: NIXL could not register memory with the EFA NIC (fi_mr_reg), "
            f"{restarts} restarts; {EFA_REGISTRATION_FIX}"
        )
        return Finding(EFA_REGISTRATION_FAILED, _trim(message), stuck=True)
    if terminated.get("reason") == "OOMKilled":
        limit = _memory_limit(pod, str(status.get("name")))
        detail = f" (memory limit {limit})" if limit else ""
        message = f"{where} was OOM-killed{detail}, {restarts} restarts"
        return Finding("OOMKilled", _trim(message), stuck=True)
    if reason == "CrashLoopBackOff":
        exit_code = terminated.get("exitCode")
        detail = f", last exit code {exit_code}" if exit_code is not None else ""
        message = f"{where} is crash-looping ({restarts} restarts{detail})"
        return Finding("CrashLoopBackOff", _trim(message), stuck=True)
    running = "running" in (status.get("state") or {})
    if running and status.get("started") is False:
        message = f"{where} has not passed its startup probe yet ({restarts} restarts)"
        return Finding("StartupProbeFailing", _trim(message), stuck=False)
    return None


def _terminated(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """The container's current termination, or its last one."""
    state = status.get("state") or {}
    last = status.get("lastState") or {}
    return dict(state.get("terminated") or last.get("terminated") or {})


def _memory_limit(pod: Mapping[str, Any], container: str) -> str | None:
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit is not None else None
    return None
