"""Roll the engine roles one at a time, prefill first: pure decisions from live StatefulSets.

A change both roles' pod templates carry (a kv-transfer setting, a new engine image) would roll
both StatefulSets at once, and with one replica per role leave no engine at all for a minute.
So decode's StatefulSet is always applied with its new template, but its RollingUpdate
`partition` (only pods with an ordinal >= partition are updated; pods below it are kept, and
recreated, at the old revision) is its replica count while prefill is still rolling, and 0 once
prefill has rolled out and is ready. A full reconcile decides the hold before it applies; a
status refresh after prefill's own status event releases it at once (see reconcile.py).

Decode is held only when it has something to roll (its template changes, or it is held
already), so a prefill scale or a lost prefill pod never touches decode. A first create has no
old decode pods to keep: partition 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from boomerang.operator import engines, render
from boomerang.operator.api import DisaggregatedDeployment


def template_hash(sts: Mapping[str, Any]) -> str | None:
    """The config hash a StatefulSet's pod template carries."""
    meta = sts.get("spec", {}).get("template", {}).get("metadata", {})
    value = (meta.get("annotations") or {}).get(render.ANNOTATION_CONFIG_HASH)
    return str(value) if value is not None else None


def partition(sts: Mapping[str, Any]) -> int:
    """The RollingUpdate partition of a StatefulSet (0 when unset)."""
    strategy = sts.get("spec", {}).get("updateStrategy") or {}
    return int((strategy.get("rollingUpdate") or {}).get("partition") or 0)


def rolled_out(sts: Mapping[str, Any] | None, desired_hash: str) -> bool:
    """True when a StatefulSet runs `desired_hash` on every pod and every pod is ready."""
    if sts is None:
        return False
    status = sts.get("status") or {}
    replicas = int(sts.get("spec", {}).get("replicas") or 0)
    observed = int(status.get("observedGeneration") or 0) >= int(
        sts.get("metadata", {}).get("generation") or 0
    )
    updated = int(status.get("updatedReplicas") or 0) == replicas or (
        status.get("currentRevision") == status.get("updateRevision")
    )
    return (
        template_hash(sts) == desired_hash
        and observed
        and updated
        and int(status.get("replicas") or 0) == replicas
        and int(status.get("readyReplicas") or 0) == replicas
    )


def decode_held(
    dd: DisaggregatedDeployment,
    prefill: Mapping[str, Any] | None,
    decode: Mapping[str, Any] | None,
) -> bool:
    """Whether decode's pods wait for prefill, from the live StatefulSets (None: absent)."""
    if decode is None:
        return False  # first create: no old decode pods to keep
    if prefill is not None and rolled_out(prefill, engines.config_hash(dd, "prefill")):
        return False
    return template_hash(decode) != engines.config_hash(dd, "decode") or partition(decode) > 0


def release_due(
    dd: DisaggregatedDeployment,
    prefill: Mapping[str, Any] | None,
    decode: Mapping[str, Any] | None,
) -> bool:
    """True when a held decode may go now and applying it would change only its partition.

    The status refresh asks this after every workload event. Requiring decode's live template
    and replicas to be the desired ones means a refresh never applies anything else, even
    when it read the resource just before a spec change that a reconcile is applying.
    """
    if decode is None or partition(decode) == 0 or decode_held(dd, prefill, decode):
        return False
    replicas = int(decode.get("spec", {}).get("replicas") or 0)
    return (
        template_hash(decode) == engines.config_hash(dd, "decode")
        and replicas == render.role_spec(dd, "decode").replicas
    )
