"""The reconciler against an in-memory API double: idempotent, level-based, honest status."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from dd_testing import manifest

from boomerang.operator import reconcile as reconcile_module
from boomerang.operator.kube import KubeError
from boomerang.operator.merge import deep_merge
from boomerang.operator.reconcile import (
    Outcome,
    StatusGate,
    edited_by_others,
    reconcile,
    refresh_status,
)
from boomerang.router.config import RouterConfig

NOW = "2026-01-01T00:00:00Z"


class MemoryKube:
    """Stores applied objects; workloads report all replicas ready once `ready` is set, else
    none ready and a rollout to the applied template pending."""

    def __init__(
        self, owner: dict[str, Any], fail_kind: str | None = None, fail_names: tuple[str, ...] = ()
    ) -> None:
        self.owner = owner
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.status_writes: list[dict[str, Any]] = []
        self.applied: list[tuple[str, str]] = []
        self.fail_kind = fail_kind
        self.fail_names = fail_names
        self.ready = False
        self.pods: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] | KubeError = []
        self.listed: list[tuple[str, dict[str, str]]] = []
        self.statuses: dict[str, dict[str, Any]] = {}
        """Per workload name: the status it reports, instead of the one `ready` implies."""
        self.created: dict[tuple[str, str], dict[str, Any]] = {}
        """Objects made by `create` (the lease token's Secret), apart from the applied ones."""

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        if obj["kind"] == self.fail_kind or obj["metadata"]["name"] in self.fail_names:
            raise KubeError("admission webhook denied the request", 403)
        stored = copy.deepcopy(dict(obj))
        stored["metadata"]["generation"] = 1
        self.objects[(obj["kind"], obj["metadata"]["name"])] = stored
        self.applied.append((obj["kind"], obj["metadata"]["name"]))
        return self._with_status(stored)

    def _with_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] in self.statuses:
            return {**obj, "status": self.statuses[obj["metadata"]["name"]]}
        if obj["kind"] in ("StatefulSet", "Deployment"):
            replicas = obj["spec"]["replicas"]
            n = replicas if self.ready else 0
            obj = {**obj, "status": {"observedGeneration": 1, "replicas": replicas,
                                     "readyReplicas": n, "updatedReplicas": n,
                                     "currentRevision": "r" if self.ready else "old",
                                     "updateRevision": "r"}}  # fmt: skip
        return obj

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        key = (obj["kind"], obj["metadata"]["name"])
        if obj["kind"] == self.fail_kind or key[1] in self.fail_names:
            raise KubeError("admission webhook denied the request", 403)
        if key in self.created:
            return None
        self.created[key] = copy.deepcopy(dict(obj))
        return copy.deepcopy(self.created[key])

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind == "DisaggregatedDeployment":
            return copy.deepcopy(self.owner)
        if (kind, name) in self.created:
            return copy.deepcopy(self.created[(kind, name)])
        obj = self.objects.get((kind, name))
        return self._with_status(obj) if obj else None

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status_writes.append(copy.deepcopy(dict(status)))
        self.owner["status"] = copy.deepcopy(dict(status))

    def apply_status(self, obj: Mapping[str, Any]) -> None:
        self.objects[(obj["kind"], obj["metadata"]["name"])]["status"] = copy.deepcopy(
            dict(obj["status"])
        )

    def list_objects(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        self.listed.append((kind, dict(labels)))
        if kind == "Node":
            if isinstance(self.nodes, KubeError):
                raise self.nodes
            items = self.nodes
        else:
            items = self.pods
        return [
            o for o in items
            if labels.items() <= (o["metadata"].get("labels") or {}).items()
        ]  # fmt: skip


def body(status: dict[str, Any] | None = None) -> dict[str, Any]:
    data = manifest("minimal")
    data["metadata"].update(namespace="team-a", uid="u-1", generation=1)
    if status is not None:
        data["status"] = status
    return data


def test_first_reconcile_applies_every_child_and_reports_progress() -> None:
    kube = MemoryKube(body())
    outcome = reconcile(kube.owner, kube, NOW)
    kinds = sorted(kind for kind, _ in kube.objects)
    assert kinds.count("StatefulSet") == 2 and kinds.count("PodDisruptionBudget") == 3
    assert len(kube.objects) == 14
    assert outcome.written and len(kube.status_writes) == 1
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"


def test_reconcile_is_idempotent_and_does_not_rewrite_unchanged_status() -> None:
    kube = MemoryKube(body())
    kube.ready = True
    reconcile(kube.owner, kube, NOW)
    second = reconcile(kube.owner, kube, "2026-01-01T00:05:00Z")
    assert not second.written
    assert second.events == []
    assert len(kube.status_writes) == 1


def test_deleted_child_is_recreated_by_the_next_reconcile() -> None:
    kube = MemoryKube(body())
    reconcile(kube.owner, kube, NOW)
    del kube.objects[("StatefulSet", "minimal-decode")]
    reconcile(kube.owner, kube, NOW)
    assert ("StatefulSet", "minimal-decode") in kube.objects


def test_workload_readiness_flows_into_status_without_applying() -> None:
    kube = MemoryKube(body())
    reconcile(kube.owner, kube, NOW)
    kube.ready = True
    applied_before = dict(kube.objects)
    outcome = refresh_status(kube.owner, kube, NOW)
    assert kube.objects == applied_before
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert ("Normal", "AllReplicasReady") in [(e[0], e[1]) for e in outcome.events]


def _partition(kube: MemoryKube, role: str) -> int:
    sts = kube.objects[("StatefulSet", f"minimal-{role}")]
    return int(sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"])


def _config_hash(kube: MemoryKube, role: str) -> str:
    sts = kube.objects[("StatefulSet", f"minimal-{role}")]
    return str(sts["spec"]["template"]["metadata"]["annotations"]["boomerang.dev/config-hash"])


def _changed(kube: MemoryKube, patch: dict[str, Any], generation: int) -> None:
    kube.owner["spec"] = deep_merge(kube.owner["spec"], patch)
    kube.owner["metadata"]["generation"] = generation


def test_first_create_never_holds_decode() -> None:
    kube = MemoryKube(body())
    reconcile(kube.owner, kube, NOW)
    assert _partition(kube, "decode") == 0 and _partition(kube, "prefill") == 0
    reconcile(kube.owner, kube, NOW)  # prefill not ready yet, but decode has nothing to roll
    assert _partition(kube, "decode") == 0


def test_a_change_to_both_roles_holds_decode_until_prefill_has_rolled_out() -> None:
    kube = MemoryKube(body())
    kube.ready = True
    reconcile(kube.owner, kube, NOW)
    old_hash = _config_hash(kube, "decode")
    _changed(kube, {"kvTransfer": {"recomputeThreshold": 256}}, generation=2)
    kube.ready = False  # prefill's new pod is starting
    outcome = reconcile(kube.owner, kube, NOW)
    assert _config_hash(kube, "decode") != old_hash, "decode gets its new template at once"
    assert _partition(kube, "decode") == 1 and _partition(kube, "prefill") == 0
    progressing = next(c for c in outcome.status["conditions"] if c["type"] == "Progressing")
    assert "decode (waits for prefill to roll out first)" in progressing["message"]
    refresh_status(kube.owner, kube, NOW)  # an event while prefill still rolls: still held
    assert _partition(kube, "decode") == 1
    # Prefill's status event: the refresh it triggers releases decode, applying nothing else.
    kube.ready = True
    kube.applied.clear()
    refresh_status(kube.owner, kube, NOW)
    assert kube.applied == [("StatefulSet", "minimal-decode")]
    assert _partition(kube, "decode") == 0
    decode = kube.objects[("StatefulSet", "minimal-decode")]
    assert decode["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    # Released, later refreshes apply nothing and reconciles keep the partition at 0.
    kube.applied.clear()
    refresh_status(kube.owner, kube, NOW)
    assert kube.applied == []
    reconcile(kube.owner, kube, NOW)
    assert _partition(kube, "decode") == 0


def test_a_change_to_decode_alone_rolls_it_at_once() -> None:
    kube = MemoryKube(body())
    kube.ready = True
    reconcile(kube.owner, kube, NOW)
    _changed(kube, {"decode": {"extraArgs": ["--max-num-seqs=64"]}}, generation=2)
    reconcile(kube.owner, kube, NOW)
    assert _partition(kube, "decode") == 0


def _engine_revision(kube: MemoryKube, role: str) -> str:
    sts = kube.objects[("StatefulSet", f"minimal-{role}")]
    return str(sts["spec"]["template"]["metadata"]["annotations"]["boomerang.dev/engine-revision"])


def _sts_status(*, rolled: bool, replicas: int = 1) -> dict[str, Any]:
    return {"observedGeneration": 1, "replicas": replicas, "readyReplicas": replicas,
            "updatedReplicas": replicas if rolled else 0, "currentRevision": "r" if rolled
            else "old", "updateRevision": "r"}  # fmt: skip


def _engine_pod(role: str, revision: str) -> dict[str, Any]:
    labels = {"boomerang.dev/deployment": "minimal", "boomerang.dev/role": role}
    annotations = {"boomerang.dev/engine-revision": revision}
    return {"metadata": {"name": f"minimal-{role}-0", "labels": labels,
                         "annotations": annotations}}  # fmt: skip


def test_a_new_engine_on_prefill_beside_decode_still_on_the_old_one_is_revision_skew() -> None:
    """The staged rollout's middle: prefill has rolled to a new image, decode's pod still runs
    the old one. Decode's pods are read (it is mid-rollout) and say so."""
    kube = MemoryKube(body())
    kube.ready = True
    reconcile(kube.owner, kube, NOW)
    old = _engine_revision(kube, "decode")
    _changed(kube, {"engine": {"image": "registry.example/connector:2"}}, generation=2)
    kube.ready = False
    reconcile(kube.owner, kube, NOW)
    assert _engine_revision(kube, "prefill") != old
    kube.statuses = {"minimal-prefill": _sts_status(rolled=True),
                     "minimal-decode": _sts_status(rolled=False)}  # fmt: skip
    kube.pods = [_engine_pod("decode", old)]
    kube.ready, kube.listed = True, []  # the router is ready
    outcome = refresh_status(kube.owner, kube, NOW)
    assert outcome.status["revisionSkew"] is True
    progressing = next(c for c in outcome.status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "RevisionSkew"
    roles = [labels.get("boomerang.dev/role") for kind, labels in kube.listed]
    assert roles == ["decode"], "only decode, mid-rollout, has its pods read"
    kube.statuses["minimal-decode"] = _sts_status(rolled=True)
    assert refresh_status(kube.owner, kube, NOW).status["revisionSkew"] is False


def test_an_unchanged_invalid_spec_is_written_and_announced_once() -> None:
    """The repair timer finds the same invalid spec every minute: status and its Warning
    event stay as they were; a different fault writes and warns again."""
    kube = MemoryKube(body())
    kube.owner["spec"]["kvTransfer"] = {"recomputeThreshold": -5}
    first = reconcile(kube.owner, kube, NOW)
    assert first.written and first.invalid
    assert [e[1] for e in first.events] == ["InvalidSpec"]
    again = reconcile(kube.owner, kube, "2026-01-01T00:01:00Z")
    assert again.invalid and not again.written and again.events == []
    assert again.status == kube.owner["status"] and len(kube.status_writes) == 1
    kube.owner["spec"]["kvTransfer"] = {"recomputeThreshold": -6}
    kube.owner["metadata"]["generation"] = 2
    third = reconcile(kube.owner, kube, "2026-01-01T00:02:00Z")
    assert third.written and [e[1] for e in third.events] == ["InvalidSpec"]
    degraded = next(c for c in third.status["conditions"] if c["type"] == "Degraded")
    assert degraded["lastTransitionTime"] == NOW, "still Degraded: its transition stays"


def test_a_failing_child_degrades_status_and_the_rest_still_apply() -> None:
    kube = MemoryKube(body(), fail_kind="NetworkPolicy")
    outcome = reconcile(kube.owner, kube, NOW)
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "NetworkPolicy" in degraded["message"]
    assert ("StatefulSet", "minimal-prefill") in kube.objects
    assert any(kind == "Warning" for kind, _, _ in outcome.events)


def test_a_half_applied_set_of_children_names_every_child_missing() -> None:
    kube = MemoryKube(body(), fail_names=("minimal-prefill", "minimal-engines"))
    outcome = reconcile(kube.owner, kube, NOW)
    conditions = {c["type"]: c for c in outcome.status["conditions"]}
    degraded, ready = conditions["Degraded"], conditions["Ready"]
    assert degraded["status"] == "True" and degraded["reason"] == "ReconcileFailed"
    message = degraded["message"]
    assert message.startswith("4 of 14 children not applied: "), message
    for child in (
        "Service minimal-prefill",
        "StatefulSet minimal-prefill",
        "PodDisruptionBudget minimal-prefill",
        "NetworkPolicy minimal-engines",
    ):
        assert child in message, message
    assert ready["status"] == "False" and ready["message"] == message
    assert ("Deployment", "minimal-router") in kube.objects  # the rest were applied


def test_a_name_too_long_for_the_children_is_reported_not_half_applied() -> None:
    bad = body()
    bad["metadata"]["name"] = "d" * 45
    kube = MemoryKube(bad)
    outcome = reconcile(bad, kube, NOW)
    assert kube.objects == {}
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert degraded["message"].startswith("Value error, metadata.name must be at most 44")


def test_a_spec_the_builders_refuse_is_reported_in_status_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        RouterConfig.model_validate({"prefill": {"urls": []}})  # raises, as a builder may
        return []

    monkeypatch.setattr(reconcile_module, "desired_children", refuse)
    kube = MemoryKube(body())
    outcome = reconcile(kube.owner, kube, NOW)
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "prefill" in degraded["message"]
    assert kube.status_writes and kube.objects == {}


def test_an_event_on_an_invalid_resource_keeps_its_status() -> None:
    kube = MemoryKube(body())
    kube.owner["spec"]["router"] = {"conversationTTL": "0s"}
    reconcile(kube.owner, kube, NOW)
    written = copy.deepcopy(kube.owner["status"])
    outcome = refresh_status(kube.owner, kube, NOW)
    assert outcome.status == written and len(kube.status_writes) == 1


def test_invalid_spec_is_reported_in_status_not_raised() -> None:
    bad = body()
    kube = MemoryKube(bad)
    bad["spec"]["kvTransfer"] = {"recomputeThreshold": -5}
    outcome = reconcile(bad, kube, NOW)
    assert kube.objects == {}
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "recomputeThreshold" in degraded["message"]


def test_status_is_computed_from_fresh_reads_not_the_callers_stale_copy() -> None:
    kube = MemoryKube(body())
    stale = copy.deepcopy(kube.owner)
    reconcile(kube.owner, kube, NOW)
    kube.ready = True
    refresh_status(kube.owner, kube, NOW)
    # A handler still holding the pre-ready body must not write "not ready" back.
    outcome = refresh_status(stale, kube, NOW)
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert not outcome.written


def test_an_event_refresh_keeps_a_reconcile_failure_until_a_reconcile_clears_it() -> None:
    kube = MemoryKube(body(), fail_kind="NetworkPolicy")
    reconcile(kube.owner, kube, NOW)
    refreshed = refresh_status(kube.owner, kube, NOW)
    degraded = next(c for c in refreshed.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ReconcileFailed"
    kube.fail_kind = None
    healed = reconcile(kube.owner, kube, NOW)
    degraded = next(c for c in healed.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"


def test_a_terminating_namespace_stops_the_reconcile_quietly() -> None:
    kube = MemoryKube(body())

    def refuse(obj: Mapping[str, Any]) -> dict[str, Any]:
        raise KubeError(
            "unable to create new content in namespace team-a because it is being terminated", 403
        )

    kube.apply = refuse  # type: ignore[method-assign]
    outcome = reconcile(kube.owner, kube, NOW)
    assert outcome.events == [] and kube.status_writes == []


def _managed(*entries: tuple[str, str, str | None]) -> dict[str, Any]:
    fields = [
        {"manager": m, "time": t, **({"subresource": sub} if sub else {})} for m, t, sub in entries
    ]
    return {"metadata": {"managedFields": fields}}


def test_edits_by_others_are_told_apart_from_our_applies_and_status_writes() -> None:
    ours, later = "2026-01-01T00:00:00Z", "2026-01-01T00:00:09Z"
    assert edited_by_others(
        _managed(("boomerang-operator", ours, None), ("kubectl-edit", later, None))
    )
    assert not edited_by_others(
        _managed(("kubectl-edit", ours, None), ("boomerang-operator", later, None))
    )
    assert not edited_by_others(
        _managed(("boomerang-operator", ours, None), ("kube-controller-manager", later, "status"))
    )


def test_refreshes_requested_while_one_runs_are_coalesced_into_one_more_round() -> None:
    gate = StatusGate()
    key = ("team-a", "minimal")
    calls: list[str] = []

    def slow_refresh() -> Outcome:
        calls.append("run")
        if len(calls) == 1:
            # Two events arrive while the first refresh is still computing.
            assert gate.run_once(key, lambda: Outcome(status={"x": 1})) is None
            assert gate.run_once(key, lambda: Outcome(status={"x": 2})) is None
        return Outcome(status={"round": len(calls)})

    outcome = gate.run_once(key, slow_refresh)
    assert calls == ["run", "run"]
    assert outcome is not None and outcome.status == {"round": 2}
    assert gate.run_once(key, lambda: Outcome(status={"again": 1})) is not None


def _node(efa: int) -> dict[str, Any]:
    allocatable = {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": str(efa)}
    return {"metadata": {"name": f"n{efa}", "labels": {}}, "status": {"allocatable": allocatable}}


def _degraded(outcome: Outcome) -> dict[str, Any]:
    return next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")


def test_a_request_no_node_can_meet_is_degraded_from_the_spec_and_stays_so_on_refresh() -> None:
    kube = MemoryKube(body())
    kube.owner["spec"]["prefill"]["resources"]["efa"] = 16
    kube.owner["spec"]["decode"]["resources"]["efa"] = 32
    kube.nodes = [_node(16), _node(16)]
    outcome = reconcile(kube.owner, kube, NOW)
    degraded = _degraded(outcome)
    assert (degraded["status"], degraded["reason"]) == ("True", "InsufficientCapacity")
    assert degraded["message"] == (
        "decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is 16 "
        "(2 nodes match)"
    )
    assert ("Warning", "InsufficientCapacity") in [(e[0], e[1]) for e in outcome.events]
    assert _degraded(refresh_status(kube.owner, kube, NOW))["reason"] == "InsufficientCapacity"
    # A restarted operator (no memory of the reconcile) keeps it until it checks again.
    restarted = refresh_status(kube.owner, kube, NOW, StatusGate())
    assert _degraded(restarted)["message"] == degraded["message"]
    kube.owner["spec"]["decode"]["resources"]["efa"] = 16
    assert _degraded(reconcile(kube.owner, kube, NOW))["status"] == "False"


def test_nodes_are_not_listed_once_the_roles_have_rolled_out() -> None:
    kube = MemoryKube(body())
    kube.ready = True
    reconcile(kube.owner, kube, NOW)  # first create: nothing live yet, so it checks
    kube.listed.clear()
    reconcile(kube.owner, kube, NOW)
    refresh_status(kube.owner, kube, NOW)
    assert kube.listed == []  # every replica ready: neither nodes nor pods are read


def test_an_operator_that_cannot_read_nodes_skips_the_preflight() -> None:
    kube = MemoryKube(body())
    kube.owner["spec"]["prefill"]["resources"]["efa"] = 16
    kube.owner["spec"]["decode"]["resources"]["efa"] = 32
    kube.nodes = KubeError('nodes is forbidden: User "x" cannot list resource "nodes"', 403)
    outcome = reconcile(kube.owner, kube, NOW)
    assert _degraded(outcome)["status"] == "False"
    assert outcome.written


def test_the_pods_of_a_role_not_ready_say_why_in_status() -> None:
    kube = MemoryKube(body())
    reconcile(kube.owner, kube, NOW)
    kube.pods = [
        {
            "metadata": {"name": "minimal-decode-0",
                         "labels": {"boomerang.dev/deployment": "minimal",
                                    "boomerang.dev/role": "decode"}},
            "status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/4 nodes are available: 4 Insufficient vpc.amazonaws.com/efa."}
            ]},
        }
    ]  # fmt: skip
    outcome = refresh_status(kube.owner, kube, NOW)
    degraded = _degraded(outcome)
    assert (degraded["status"], degraded["reason"]) == ("True", "Unschedulable")
    assert degraded["message"] == (
        "decode: pod minimal-decode-0: 0/4 nodes are available: 4 Insufficient "
        "vpc.amazonaws.com/efa."
    )
    roles = {labels["boomerang.dev/role"] for kind, labels in kube.listed if kind == "Pod"}
    assert roles == {"prefill", "decode", "router"}


def test_an_engine_that_cannot_register_memory_with_efa_is_degraded_with_the_fix() -> None:
    """The engine's termination message (connector/entrypoint.py) becomes Degraded's reason."""
    kube = MemoryKube(body())
    reconcile(kube.owner, kube, NOW)
    said = (
        "EFAMemoryRegistrationFailed: fi_mr_reg failed on rail 0: Permission denied; "
        "fix: set spec.efa.privileged: true"
    )
    kube.pods = [
        {
            "metadata": {"name": "minimal-prefill-0",
                         "labels": {"boomerang.dev/deployment": "minimal",
                                    "boomerang.dev/role": "prefill"}},
            "status": {"containerStatuses": [
                {"name": "engine", "restartCount": 2,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": said}}}
            ]},
        }
    ]  # fmt: skip
    degraded = _degraded(refresh_status(kube.owner, kube, NOW))
    assert (degraded["status"], degraded["reason"]) == ("True", "EFAMemoryRegistrationFailed")
    assert degraded["message"].startswith(
        "prefill: pod minimal-prefill-0 container engine: NIXL could not register memory with "
        "the EFA NIC (fi_mr_reg), 2 restarts; set spec.efa.privileged: true"
    )
