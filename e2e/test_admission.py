"""Bad DisaggregatedDeployments are rejected by the API server, with messages naming the field.

Each case sends a server-side dry-run create (full admission: OpenAPI schema, CEL rules, strict
field validation) of a valid sample broken in one place, and expects the error to name that
field. A coverage test checks that every CEL rule in the installed CRD is hit by some case, so a
rule added later without a case fails here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from cluster import Cluster
from suite import DD, example, patched

pytestmark = pytest.mark.cluster

Spec = dict[str, Any]


def _set(path: str, value: Any) -> Callable[[Spec], Spec]:
    return lambda obj: patched(obj, path, value)


def _both(*changes: Callable[[Spec], Spec]) -> Callable[[Spec], Spec]:
    def apply(obj: Spec) -> Spec:
        for change in changes:
            obj = change(obj)
        return obj

    return apply


def _drop_model(obj: Spec) -> Spec:
    new = patched(obj, "spec.model", None)
    del new["spec"]["model"]
    return new


# (case id, change to a valid sample, texts the rejection must contain)
CASES: list[tuple[str, Callable[[Spec], Spec], tuple[str, ...]]] = [
    # CEL rules (cross-field)
    (
        "router-ttl-not-below-decoder-ttl",
        _both(
            _set("spec.kvTransfer.decoderBlocksTTL", "60s"),
            _set("spec.router.conversationTTL", "58s"),
        ),
        ("spec.router.conversationTTL", "decoderBlocksTTL"),
    ),
    (
        "decoder-ttl-too-short",
        _set("spec.kvTransfer.decoderBlocksTTL", "5s"),
        ("spec.kvTransfer.decoderBlocksTTL", "at least"),
    ),
    (
        "lease-too-short",
        _set("spec.kvTransfer.leaseDuration", "500ms"),
        ("spec.kvTransfer.leaseDuration", "at least"),
    ),
    (
        "efa-with-ucx",
        _both(_set("spec.prefill.resources.efa", 4), _set("spec.kvTransfer.backend", "UCX")),
        ("spec.kvTransfer.backend", "LIBFABRIC"),
    ),
    (
        "bidirectional-needs-nixl",
        _set("spec.kvTransfer.connector", "LMCacheConnectorV1"),
        ("spec.kvTransfer.connector", "NixlConnector"),
    ),
    (
        "redis-without-url",
        _set("spec.router.store", {"type": "redis"}),
        ("spec.router.store", "required when"),
    ),
    (
        "redis-url-and-secret",
        _set(
            "spec.router.store",
            {"type": "redis", "url": "redis://r:6379/0", "urlSecretRef": {"name": "r", "key": "u"}},
        ),
        ("spec.router.store", "mutually exclusive"),
    ),
    (
        "open-internet-load-balancer-without-keys",
        _set("spec.router.service", {"type": "LoadBalancer"}),
        ("spec.router.apiKeySecretRef", "internet-facing"),
    ),
    (
        "persistent-cache-without-size",
        _set("spec.model.cache", {"persistent": True}),
        ("spec.model.cache.size", "required"),
    ),
    (
        "required-placement-without-key",
        _set("spec.placement", {"required": True}),
        ("spec.placement.topologyKey", "required"),
    ),
    (
        "prefill-gpus-not-multiple-of-tp",
        _both(
            _set("spec.prefill.resources", {"gpus": 3}), _set("spec.prefill.tensorParallelSize", 2)
        ),
        ("spec.prefill.resources.gpus", "multiple"),
    ),
    (
        "decode-gpus-not-multiple-of-tp",
        _both(
            _set("spec.decode.resources", {"gpus": 6}), _set("spec.decode.tensorParallelSize", 4)
        ),
        ("spec.decode.resources.gpus", "multiple"),
    ),
    # OpenAPI schema: types, bounds, patterns, enums, required and unknown fields
    ("replicas-not-integer", _set("spec.decode.replicas", "two"), ("spec.decode.replicas",)),
    ("replicas-zero", _set("spec.prefill.replicas", 0), ("spec.prefill.replicas",)),
    ("model-source-scheme", _set("spec.model.source", "ftp://x/y"), ("spec.model.source",)),
    ("model-missing", _drop_model, ("spec.model", "Required")),
    (
        "duration-not-parseable",
        _set("spec.kvTransfer.decoderBlocksTTL", "8 minutes"),
        ("spec.kvTransfer.decoderBlocksTTL",),
    ),
    ("backend-enum", _set("spec.kvTransfer.backend", "TCP"), ("spec.kvTransfer.backend", "TCP")),
    (
        "memory-not-a-quantity",
        _set("spec.decode.resources", {"memory": "lots"}),
        ("spec.decode.resources.memory",),
    ),
    ("router-port-range", _set("spec.router.service.port", 70000), ("spec.router.service.port",)),
    ("negative-threshold", _set("spec.kvTransfer.recomputeThreshold", -1), ("recomputeThreshold",)),
    (
        "unknown-field-typo",
        _set("spec.prefill.replica", 2),
        ("unknown field", "spec.prefill.replica"),
    ),
]


# CEL rules that no resource can violate, with why. Each is a defect to fix in the API (remove
# the rule or widen what it guards); the coverage test fails once an entry here becomes stale.
UNREACHABLE: dict[str, str] = {}


def _dry_run_create(cluster: Cluster, obj: Spec) -> tuple[int, str]:
    result = cluster.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-n", "default", "-f", "-", "-o", "name",
        input=json.dumps(obj), check=False,
    )  # fmt: skip
    return result.returncode, result.stderr + result.stdout


def test_the_valid_base_sample_is_accepted(cluster: Cluster, chart: str) -> None:
    code, output = _dry_run_create(cluster, example("minimal.yaml"))
    assert code == 0, output


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_resource_is_rejected_naming_the_field(
    cluster: Cluster, chart: str, change: Callable[[Spec], Spec], expected: tuple[str, ...]
) -> None:
    code, output = _dry_run_create(cluster, change(example("minimal.yaml")))
    assert code != 0, f"accepted a bad resource:\n{output}"
    for text in expected:
        assert text in output, f"rejection does not mention {text!r}:\n{output}"


def test_every_cel_rule_in_the_crd_has_a_rejection_case(cluster: Cluster, chart: str) -> None:
    crd = cluster.get_json("crd", DD)
    version = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = version["properties"]["spec"].get("x-kubernetes-validations", [])
    assert len(rules) >= 5, "expected the CRD to carry its cross-field CEL rules"
    outputs = [
        _dry_run_create(cluster, change(example("minimal.yaml")))[1] for _, change, _ in CASES
    ]
    uncovered = {r["message"] for r in rules if not any(r["message"] in o for o in outputs)}
    assert not uncovered - set(UNREACHABLE), f"CEL rules no case triggers: {uncovered}"
    stale = set(UNREACHABLE) - uncovered
    assert not stale, f"now reachable or gone, remove from UNREACHABLE: {stale}"
