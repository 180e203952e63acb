"""Which engine revisions the pods of P and D run, and whether they differ (`revisionSkew`).

NIXL pairs a prefill engine with a decode engine only when both run the same engine build and
connector protocol: the engine revision (`render.engine_revision`), which every engine pod
carries as an annotation. A StatefulSet whose controller has seen its current spec and has no
update pending runs its template's revision on every pod, so a settled role costs no read. One
mid-rollout (part-way, or decode held by its partition while prefill rolls, rollout.py) runs
what its pods say: the caller reads them for such a role. So a prefill that has rolled to a new
engine beside a decode still entirely on the old one is skew (and the reverse), while a change
that leaves the engine revision alone (a kv-transfer setting) is not, however its pods roll.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from boomerang.operator.render import ANNOTATION_ENGINE_REVISION


def at_one_revision(sts: Mapping[str, Any]) -> bool:
    """Every pod of a StatefulSet runs its template: its controller has seen the current spec
    and has no update pending. Otherwise only its pods say which revisions they run."""
    status = sts.get("status") or {}
    observed = int(status.get("observedGeneration") or 0) >= int(
        sts.get("metadata", {}).get("generation") or 0
    )
    return observed and status.get("currentRevision") == status.get("updateRevision")


def running(sts: Mapping[str, Any], pods: Sequence[Mapping[str, Any]] | None) -> frozenset[str]:
    """The engine revisions one role's pods run: its template's when it is at one revision
    (and has pods), else what its pods carry (None: not read, unknown). Pods on their way out,
    and pods without the annotation (made by an older operator), do not count."""
    if at_one_revision(sts):
        revision = _revision(sts.get("spec", {}).get("template", {}))
        has_pods = int((sts.get("status") or {}).get("replicas") or 0) > 0
        return frozenset({revision}) if revision and has_pods else frozenset()
    return frozenset(
        revision
        for pod in pods or ()
        if (revision := _revision(pod)) and not pod.get("metadata", {}).get("deletionTimestamp")
    )


def skewed(prefill: frozenset[str], decode: frozenset[str]) -> bool:
    """True while the pods of P and D between them run more than one engine revision: one role
    has rolled to a new engine and the other not yet (either way round), or one is part-way.
    Then some P and some D pods run different engine builds, which NIXL cannot pair."""
    return len(prefill | decode) > 1


def _revision(obj: Mapping[str, Any]) -> str | None:
    """The engine revision a pod or a pod template is annotated with."""
    value = (obj.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ENGINE_REVISION)
    return str(value) if value else None
