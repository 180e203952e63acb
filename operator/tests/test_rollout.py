"""Staged engine rollouts: when prefill counts as rolled out, when decode waits, when it goes."""

from __future__ import annotations

from typing import Any

import pytest
from dd_testing import deployment

from boomerang.facts.engine import Role
from boomerang.operator import engines
from boomerang.operator.api import DisaggregatedDeployment
from boomerang.operator.rollout import decode_held, release_due, rolled_out

OLD = deployment(generation=1)
NEW = deployment(patch={"kvTransfer": {"recomputeThreshold": 256}}, generation=2)


def live(
    dd: DisaggregatedDeployment,
    role: Role,
    *,
    held: bool = False,
    replicas: int | None = None,
    **status: Any,
) -> dict[str, Any]:
    """A StatefulSet as the API server returns it: rendered from `dd`, all pods rolled out and
    ready unless `status` says otherwise (a None value leaves that field unreported)."""
    sts = engines.build_statefulset(dd, role, held=held)
    if replicas is not None:
        sts["spec"]["replicas"] = replicas
    n = sts["spec"]["replicas"]
    sts["metadata"]["generation"] = 4
    reported = {
        "observedGeneration": 4,
        "replicas": n,
        "readyReplicas": n,
        "updatedReplicas": n,
        "currentRevision": "a",
        "updateRevision": "a",
        **status,
    }
    sts["status"] = {k: v for k, v in reported.items() if v is not None}
    return sts


@pytest.mark.parametrize(
    ("sts", "expected"),
    [
        (live(NEW, "prefill"), True),
        (live(NEW, "prefill", updatedReplicas=None), True),  # revisions equal: all updated
        (live(OLD, "prefill"), False),  # the template carries another config hash
        (live(NEW, "prefill", observedGeneration=3), False),  # controller not caught up
        (live(NEW, "prefill", updatedReplicas=0, updateRevision="b"), False),  # pods rolling
        (live(NEW, "prefill", readyReplicas=0), False),  # the new pod not ready yet
        (live(NEW, "prefill", replicas=2, readyReplicas=1, updatedReplicas=1), False),
        (None, False),
    ],
    ids=["rolled-out", "updated-unreported", "old-template", "generation-unobserved",
         "pods-rolling", "pod-not-ready", "scale-up-pending", "absent"],
)  # fmt: skip
def test_prefill_counts_as_rolled_out_only_when_every_pod_runs_the_desired_hash_ready(
    sts: dict[str, Any] | None, expected: bool
) -> None:
    assert rolled_out(sts, engines.config_hash(NEW, "prefill")) is expected


ROLLING = live(NEW, "prefill", readyReplicas=0, updatedReplicas=0, updateRevision="b")


@pytest.mark.parametrize(
    ("prefill", "decode", "held"),
    [
        (None, None, False),  # first create: no old decode pods to keep
        (ROLLING, None, False),  # decode deleted meanwhile: its new pods have one revision
        (live(OLD, "prefill"), live(OLD, "decode"), True),  # a change both roles' pods carry
        (ROLLING, live(NEW, "decode", held=True), True),  # stays held while prefill rolls
        (None, live(NEW, "decode", held=True), True),  # prefill recreated: wait for it too
        (ROLLING, live(NEW, "decode"), False),  # nothing for decode to roll: never touched
        (live(NEW, "prefill"), live(OLD, "decode"), False),  # prefill done (or unchanged)
        (live(NEW, "prefill"), live(NEW, "decode", held=True), False),  # released
    ],
    ids=["first-create", "decode-absent", "both-change", "held-while-rolling",
         "prefill-recreated", "decode-unchanged", "prefill-done", "prefill-done-release"],
)  # fmt: skip
def test_decode_waits_only_while_prefill_rolls_and_decode_has_pods_to_roll(
    prefill: dict[str, Any] | None, decode: dict[str, Any] | None, held: bool
) -> None:
    assert decode_held(NEW, prefill, decode) is held


@pytest.mark.parametrize(
    ("dd", "prefill", "decode", "due"),
    [
        (NEW, live(NEW, "prefill"), live(NEW, "decode", held=True), True),
        (NEW, ROLLING, live(NEW, "decode", held=True), False),  # prefill still rolling
        (NEW, live(NEW, "prefill"), live(NEW, "decode"), False),  # not held
        (NEW, live(NEW, "prefill"), None, False),
        # A refresh that read the resource before a spec change a reconcile is applying: the
        # live decode is not what this spec renders, so the refresh must not apply it.
        (OLD, live(OLD, "prefill"), live(NEW, "decode", held=True), False),
        (NEW, live(NEW, "prefill"), live(NEW, "decode", held=True, replicas=3), False),
    ],
    ids=["prefill-done", "prefill-rolling", "not-held", "decode-absent", "stale-spec",
         "replicas-differ"],
)  # fmt: skip
def test_a_refresh_releases_decode_only_when_just_its_partition_would_change(
    dd: DisaggregatedDeployment,
    prefill: dict[str, Any] | None,
    decode: dict[str, Any] | None,
    due: bool,
) -> None:
    assert release_due(dd, prefill, decode) is due
