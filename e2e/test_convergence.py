"""Spec changes converge: scale, settings that roll pods through the config hash, a new image.

Each change is made with every node cordoned, so the pods it creates stay Pending and the
rollout is still under way when the test looks: the status must say Progressing (not Ready,
not Degraded) for the new generation. kwok would otherwise make pods Ready faster than the
operator may first look, and a status that goes straight to Ready is then correct but shows
nothing. Uncordoned, the change must reach Ready. Pods are told apart by UID (StatefulSet pods
keep their names when replaced). A change both roles' pods carry rolls prefill first: decode's
pods are held (its StatefulSet's partition) until prefill's new pods are ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from cluster import Cluster
from kube import condition, is_true, wait_until
from suite import apply, converged, get_dd, nodes_cordoned, patched, pods, wait_ready

pytestmark = pytest.mark.cluster
CONFIG_HASH = "boomerang.dev/config-hash"
ENGINE_REVISION = "boomerang.dev/engine-revision"
EVENT_DEADLINE_S = 20


def _engine_pods(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["uid"]: p
        for p in pods(cluster, namespace, name)
        if p["metadata"]["labels"].get("boomerang.dev/role") in ("prefill", "decode")
    }


def _sts(cluster: Cluster, namespace: str, name: str, role: str) -> dict[str, Any]:
    return cluster.get_json("statefulset", f"{name}-{role}", "-n", namespace)


def _change(
    cluster: Cluster,
    namespace: str,
    manifest: dict[str, Any],
    path: str,
    value: Any,
    until: Callable[[dict[str, Any]], bool] = lambda _dd: True,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply one spec change; return the converged resource and the Progressing one seen (the
    first for which `until` holds too)."""
    name = manifest["metadata"]["name"]
    with nodes_cordoned(cluster):
        apply(cluster, patched(manifest, path, value), namespace)
        generation = get_dd(cluster, namespace, name)["metadata"]["generation"]

        def progressing() -> dict[str, Any] | None:
            dd = get_dd(cluster, namespace, name)
            status = dd.get("status") or {}
            rolling = status.get("observedGeneration") == generation and is_true(dd, "Progressing")
            return dd if rolling and until(dd) else None

        seen = wait_until(f"Progressing for generation {generation}", progressing, timeout=60)
        assert not is_true(seen, "Ready"), _brief(seen)
        assert not is_true(seen, "Degraded"), _brief(seen)
    return wait_ready(cluster, namespace, name, timeout=120), seen


def _brief(version: dict[str, Any]) -> str:
    """One status as `gen/observed Ready Progressing decode-counts`, for failure messages."""
    status = version.get("status") or {}
    flags = [c["type"] for c in status.get("conditions", []) if c.get("status") == "True"]
    return (
        f"{version['metadata'].get('generation')}/{status.get('observedGeneration')} "
        f"{','.join(flags) or '-'} decode={status.get('decode')}"
    )


def test_scaling_decode_converges_to_the_new_count(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    name = ready_minimal["metadata"]["name"]
    before = _engine_pods(cluster, namespace, name)
    dd, _ = _change(cluster, namespace, ready_minimal, "spec.decode.replicas", 3)
    assert dd["status"]["decode"] == {"desired": 3, "ready": 3, "updated": 3}
    assert dd["status"]["prefill"]["ready"] == 1
    assert _sts(cluster, namespace, name, "decode")["spec"]["replicas"] == 3
    after = _engine_pods(cluster, namespace, name)
    assert len(after) == 4
    assert set(before) <= set(after), "scaling replaced pods it should have kept"


def test_scale_changes_reach_ready_from_events_not_the_repair_timer(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    """Ready must follow the workloads' own events. The repair timer (60s) would also get
    there eventually; a deadline well under it catches a lost or stale status write."""
    name = ready_minimal["metadata"]["name"]
    manifest = ready_minimal
    for cycle in range(4):
        for replicas in (2, 1):
            manifest = patched(manifest, "spec.decode.replicas", replicas)
            apply(cluster, manifest, namespace)
            dd = wait_ready(cluster, namespace, name, timeout=EVENT_DEADLINE_S)
            decode = dd["status"]["decode"]
            # Ready may be reported while a surplus pod is still terminating after scale-down.
            assert decode["desired"] == replicas, f"cycle {cycle}: {decode}"
            assert decode["ready"] >= replicas, f"cycle {cycle}: {decode}"


@pytest.mark.parametrize(
    ("path", "value", "status_key", "expected", "router_sees_it"),
    [
        ("spec.kvTransfer.decoderBlocksTTL", "600s", "decoderBlocksTTLSeconds", 600, True),
        ("spec.kvTransfer.recomputeThreshold", 256, "recomputeThreshold", 256, True),
    ],
    ids=["decoder-ttl", "recompute-threshold"],
)
def test_kv_setting_change_rolls_every_engine_pod(
    cluster: Cluster,
    namespace: str,
    ready_minimal: dict[str, Any],
    path: str,
    value: Any,
    status_key: str,
    expected: int,
    router_sees_it: bool,
) -> None:
    name = ready_minimal["metadata"]["name"]
    router_config = cluster.get_json("configmap", f"{name}-router", "-n", namespace)["data"]
    hashes = {
        r: _sts(cluster, namespace, name, r)["spec"]["template"]["metadata"]["annotations"]
        for r in ("prefill", "decode")
    }
    before = _engine_pods(cluster, namespace, name)
    dd, _ = _change(cluster, namespace, ready_minimal, path, value)
    assert dd["status"]["kvTransfer"][status_key] == expected
    for role in ("prefill", "decode"):
        annotations = _sts(cluster, namespace, name, role)["spec"]["template"]["metadata"]
        assert annotations["annotations"][CONFIG_HASH] != hashes[role][CONFIG_HASH], role
    after = _engine_pods(cluster, namespace, name)
    assert len(after) == 2
    assert not set(before) & set(after), "some engine pods kept the old configuration"
    config = cluster.get_json("configmap", f"{name}-router", "-n", namespace)["data"]
    assert (config != router_config) == router_sees_it


def test_new_image_rolls_both_roles_to_one_engine_revision(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    name = ready_minimal["metadata"]["name"]
    old_revision = wait_ready(cluster, namespace, name)["status"]["engineRevision"]
    image = "boomerang/connector:0.2.0"

    # Prefill's new pod (Pending on the cordoned nodes) beside decode's old one, held: skew.
    # The status may name the skew one reconcile before decode's partition holds it (a loaded
    # machine showed that snapshot): wait for both.
    def held_in_skew(seen: dict[str, Any]) -> bool:
        message = str((condition(seen, "Progressing") or {}).get("message"))
        return seen["status"].get("revisionSkew") is True and "decode waits for" in message

    dd, rolling = _change(
        cluster, namespace, ready_minimal, "spec.engine.image", image, until=held_in_skew
    )
    assert (condition(rolling, "Progressing") or {}).get("reason") == "RevisionSkew"
    assert "decode waits for prefill" in str((condition(rolling, "Progressing") or {})["message"])
    assert dd["status"]["engineRevision"] != old_revision
    assert dd["status"]["revisionSkew"] is False
    revisions = set()
    for role in ("prefill", "decode"):
        template = _sts(cluster, namespace, name, role)["spec"]["template"]
        assert template["spec"]["containers"][0]["image"] == image
        revisions.add(template["metadata"]["annotations"][ENGINE_REVISION])
    assert revisions == {dd["status"]["engineRevision"]}
    for pod in _engine_pods(cluster, namespace, name).values():
        assert pod["spec"]["containers"][0]["image"] == image
        assert is_true(pod, "Ready")
    # The status names the new revision while the pods are still rolling to it.
    assert rolling["status"]["engineRevision"] == dd["status"]["engineRevision"]


def _role(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"].get("boomerang.dev/role"))


def _hash(obj: dict[str, Any]) -> str:
    """The config hash of a pod, or of a StatefulSet's pod template."""
    meta = obj["spec"]["template"]["metadata"] if obj["kind"] == "StatefulSet" else obj["metadata"]
    return str(meta["annotations"][CONFIG_HASH])


def _partition(sts: dict[str, Any]) -> int:
    return int(sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"])


def _prefill_replaced_decode_held(
    cluster: Cluster, namespace: str, name: str, generation: int, before: set[str]
) -> bool:
    """Prefill's old pod is gone, the resource says decode waits, and decode's controller has
    its new template in hand (an update revision of its own) yet keeps the old pod."""
    engine = _engine_pods(cluster, namespace, name)
    prefill = {uid for uid, p in engine.items() if _role(p) == "prefill"}
    dd = get_dd(cluster, namespace, name)
    message = str((condition(dd, "Progressing") or {}).get("message"))
    said = dd["status"].get("observedGeneration") == generation and "decode (waits" in message
    status = _sts(cluster, namespace, name, "decode").get("status") or {}
    pending = status.get("updateRevision") != status.get("currentRevision")
    return bool(prefill) and not prefill & before and said and pending


def _converge_in_order(
    cluster: Cluster, namespace: str, name: str, before: set[str], decode_hash: str
) -> tuple[dict[str, Any], float]:
    """Poll the engine pods until the resource is Ready, checking that no decode pod runs the
    new configuration before prefill's new pod is Ready; returns the resource and the seconds
    from prefill's new pod Ready to decode's new pod (each first seen by a poll)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while True:
        engine = list(_engine_pods(cluster, namespace, name).values())
        at = time.monotonic()
        prefill = [p for p in engine if _role(p) == "prefill" and is_true(p, "Ready")
                   and p["metadata"]["uid"] not in before]  # fmt: skip
        decode = [p for p in engine if _role(p) == "decode" and _hash(p) == decode_hash]
        assert not decode or prefill, "decode rolled before prefill's new pod was Ready"
        for role, pods_ in (("prefill", prefill), ("decode", decode)):
            if pods_:
                seen.setdefault(role, at)
        dd = get_dd(cluster, namespace, name)
        if converged(dd) and decode and is_true(decode[0], "Ready"):
            return dd, seen["decode"] - seen["prefill"]
        assert at < deadline, f"not converged in 120s: {_brief(dd)}"
        time.sleep(0.2)


def test_a_change_to_both_roles_rolls_prefill_first_then_decode(
    cluster: Cluster, namespace: str, ready_minimal: dict[str, Any]
) -> None:
    """With one pod per role, rolling both at once would leave no engine for the router. Decode's
    pod keeps its old configuration until prefill's new pod is Ready; then decode rolls,
    released by prefill's own status event (well before the 60 s repair timer)."""
    name = ready_minimal["metadata"]["name"]
    old = {r: _hash(_sts(cluster, namespace, name, r)) for r in ("prefill", "decode")}
    before = _engine_pods(cluster, namespace, name)
    manifest = patched(ready_minimal, "spec.kvTransfer.recomputeThreshold", 256)
    with nodes_cordoned(cluster):
        apply(cluster, manifest, namespace)
        generation = get_dd(cluster, namespace, name)["metadata"]["generation"]
        wait_until(
            "prefill's pod replaced and decode's held",
            lambda: _prefill_replaced_decode_held(
                cluster, namespace, name, generation, set(before)
            ),
            timeout=60,
        )
        seen = get_dd(cluster, namespace, name)
        assert is_true(seen, "Progressing") and not is_true(seen, "Ready"), _brief(seen)
        assert not is_true(seen, "Degraded"), _brief(seen)
        # A setting the engine revision leaves alone: both roles run the same build.
        assert seen["status"]["revisionSkew"] is False, _brief(seen)
        decode = _sts(cluster, namespace, name, "decode")
        assert _partition(decode) == decode["spec"]["replicas"] == 1
        assert _hash(decode) != old["decode"], "decode's new template was not applied"
        for uid, pod in _engine_pods(cluster, namespace, name).items():
            if _role(pod) == "decode":
                assert uid in before and _hash(pod) == old["decode"] and is_true(pod, "Ready")
            else:
                assert _hash(pod) != old["prefill"], "prefill did not start rolling"
    dd, delay = _converge_in_order(cluster, namespace, name, set(before), _hash(decode))
    assert delay < EVENT_DEADLINE_S, f"decode rolled {delay:.0f}s after prefill: the timer?"
    print(f"decode's new pod seen {delay:.1f}s after prefill's new pod was Ready")
    assert dd["metadata"]["generation"] == generation
    assert dd["status"]["kvTransfer"]["recomputeThreshold"] == 256
    assert dd["status"]["decode"] == {"desired": 1, "ready": 1, "updated": 1}
    assert _partition(_sts(cluster, namespace, name, "decode")) == 0
    after = _engine_pods(cluster, namespace, name)
    assert len(after) == 2 and not set(before) & set(after)
