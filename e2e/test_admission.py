"""Bad DisaggregatedDeployments are rejected by the API server, with messages naming the field.

Each case of operator/tests/invalid-specs.yaml (the table the pydantic unit tests share) sends a
server-side dry-run create (full admission: OpenAPI schema, CEL rules, strict field validation)
of a valid sample broken in one place, and expects the error to name that field and, for a CEL
rule, to carry that rule's own message whole. A rule that fails to evaluate also puts its
message in the error (`no such key: annotations evaluating rule: <message>`), so no output may
carry a CEL evaluation error at all. The rules must evaluate on any object, not only on one the
API server has filled defaults into: the same cases run against a copy of the CRD with every
schema default removed. A coverage test checks that every CEL rule in the installed CRD is hit
by some case, so a rule added later without a case fails here. The status the operator writes
for Adaptive tuning (what the router learned) is kept whole by the status schema, not pruned.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster
from dd_testing import INVALID, invalid_manifest, rule_for
from suite import CEL_ERRORS, DD, EXAMPLES, example

from boomerang.operator import tuning
from boomerang.operator.api import MAX_NAME_LENGTH, DisaggregatedDeployment
from boomerang.operator.status import compute_status

pytestmark = pytest.mark.cluster

# CEL rules that no resource can violate, with why. Each is a defect to fix in the API (remove
# the rule or widen what it guards); the coverage test fails once an entry here becomes stale.
UNREACHABLE: dict[str, str] = {}

BARE_GROUP = "nodefaults.boomerang.dev"
"""The group of the CRD copy without schema defaults (a group of its own: no clash)."""


def assert_refused_for_its_own_reason(case: dict[str, Any], code: int, output: str) -> None:
    assert code != 0, f"accepted a bad resource:\n{output}"
    assert not [e for e in CEL_ERRORS if e in output], f"a rule failed to evaluate:\n{output}"
    for text in (case["field"], case.get("message", "")):
        assert text in output, f"rejection does not mention {text!r}:\n{output}"
    rule = rule_for(case)
    assert rule is None or rule.message in output, f"not its rule's own message:\n{output}"


def _dry_run_create(cluster: Cluster, obj: dict[str, Any]) -> tuple[int, str]:
    result = cluster.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-n", "default", "-f", "-", "-o", "name",
        input=json.dumps(obj), check=False,
    )  # fmt: skip
    return result.returncode, result.stderr + result.stdout


def test_the_valid_base_sample_is_accepted(cluster: Cluster, chart: str) -> None:
    code, output = _dry_run_create(cluster, example("minimal.yaml"))
    assert code == 0, output


def test_the_longest_name_the_children_allow_is_accepted(cluster: Cluster, chart: str) -> None:
    obj = example("minimal.yaml")
    obj["metadata"]["name"] = "d" * MAX_NAME_LENGTH
    code, output = _dry_run_create(cluster, obj)
    assert code == 0, output


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c["name"])
def test_bad_resource_is_rejected_naming_the_field(
    cluster: Cluster, chart: str, case: dict[str, Any]
) -> None:
    code, output = _dry_run_create(cluster, invalid_manifest(case))
    assert_refused_for_its_own_reason(case, code, output)


def _without_defaults(node: Any) -> Any:
    if isinstance(node, list):
        return [_without_defaults(item) for item in node]
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    return node


@pytest.fixture(scope="module")
def bare_crd(cluster: Cluster, chart: str) -> Iterator[str]:
    """The installed CRD, rules and all, with every schema default removed, under its own
    group; yields its apiVersion."""
    crd = cluster.get_json("crd", DD)
    names = crd["spec"]["names"]
    bare = {
        "apiVersion": crd["apiVersion"],
        "kind": crd["kind"],
        "metadata": {"name": f"{names['plural']}.{BARE_GROUP}"},
        "spec": {**_without_defaults(crd["spec"]), "group": BARE_GROUP},
    }
    bare["spec"]["names"] = {k: v for k, v in names.items() if k != "categories"}
    assert '"default"' not in json.dumps(bare["spec"]["versions"])
    cluster.kubectl("create", "-f", "-", input=json.dumps(bare))
    name = bare["metadata"]["name"]
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    try:
        yield f"{BARE_GROUP}/{crd['spec']['versions'][0]['name']}"
    finally:
        cluster.kubectl("delete", f"crd/{name}", "--wait=false", check=False)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_sample_is_accepted_without_schema_defaults(
    cluster: Cluster, bare_crd: str, path: Path
) -> None:
    obj = {**example(path.name), "apiVersion": bare_crd}
    code, output = _dry_run_create(cluster, obj)
    assert code == 0, output


def test_a_spec_of_the_required_fields_alone_is_accepted_without_schema_defaults(
    cluster: Cluster, bare_crd: str
) -> None:
    obj = {**example("minimal.yaml"), "apiVersion": bare_crd}
    obj["spec"] = {"model": obj["spec"]["model"]}
    code, output = _dry_run_create(cluster, obj)
    assert code == 0, output


def test_an_internal_load_balancer_needs_no_keys_without_schema_defaults(
    cluster: Cluster, bare_crd: str
) -> None:
    obj = {**example("minimal.yaml"), "apiVersion": bare_crd}
    annotations = {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}
    obj["spec"]["router"] = {"service": {"type": "LoadBalancer", "annotations": annotations}}
    code, output = _dry_run_create(cluster, obj)
    assert code == 0, output


@pytest.mark.parametrize("case", [c for c in INVALID if rule_for(c)], ids=lambda c: c["name"])
def test_every_rule_refuses_for_its_own_reason_without_schema_defaults(
    cluster: Cluster, bare_crd: str, case: dict[str, Any]
) -> None:
    obj = {**invalid_manifest(case), "apiVersion": bare_crd}
    code, output = _dry_run_create(cluster, obj)
    assert_refused_for_its_own_reason(case, code, output)


def test_every_cel_rule_in_the_crd_has_a_rejection_case(cluster: Cluster, chart: str) -> None:
    crd = cluster.get_json("crd", DD)
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = root.get("x-kubernetes-validations", [])
    rules += root["properties"]["spec"].get("x-kubernetes-validations", [])
    assert len(rules) >= 5, "expected the CRD to carry its CEL rules"
    outputs = [_dry_run_create(cluster, invalid_manifest(case))[1] for case in INVALID]
    uncovered = {r["message"] for r in rules if not any(r["message"] in o for o in outputs)}
    assert not uncovered - set(UNREACHABLE), f"CEL rules no case triggers: {uncovered}"
    stale = set(UNREACHABLE) - uncovered
    assert not stale, f"now reachable or gone, remove from UNREACHABLE: {stale}"


def test_the_learned_tuning_status_is_kept_by_the_status_schema(
    cluster: Cluster, chart: str, namespace: str
) -> None:
    obj = example("minimal.yaml")
    obj["spec"]["kvTransfer"] = {"tuning": {"mode": "Adaptive"}}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj))
    state = {"mode": "adaptive", "break_even_tokens": 912.0, "retention_s": 143.0,
             "paths": {"pull": 10, "recompute": 3, "continue": 37}, "retained_blocks": 120,
             "retained_fraction": 0.31}  # fmt: skip
    learned = tuning.in_force(None, tuning.learned(state), "2026-01-01T00:00:00Z")
    dd = DisaggregatedDeployment.model_validate({**obj, "metadata": {**obj["metadata"]}})
    status = compute_status(dd, {}, None, "2026-01-01T00:00:00Z", learned=learned)
    result = cluster.kubectl(
        "patch", DD, obj["metadata"]["name"], "-n", namespace, "--subresource=status",
        "--type=merge", "--dry-run=server", "-o", "json", "-p", json.dumps({"status": status}),
    )  # fmt: skip
    stored = json.loads(result.stdout)["status"]["kvTransfer"]
    assert stored == status["kvTransfer"]
    assert stored["pathShares"] == {"pull": 20, "recompute": 6, "continue": 74}
