"""Bad DisaggregatedDeployments are rejected by the API server, with messages naming the field.

Each case of operator/tests/invalid-specs.yaml (the table the pydantic unit tests share) sends a
server-side dry-run create (full admission: OpenAPI schema, CEL rules, strict field validation)
of a valid sample broken in one place, and expects the error to name that field. A coverage test
checks that every CEL rule in the installed CRD is hit by some case, so a rule added later
without a case fails here. The status the operator writes for Adaptive tuning (what the router
learned) is kept whole by the status schema, not pruned.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cluster import Cluster
from dd_testing import INVALID, invalid_manifest
from suite import DD, example

from boomerang.operator import tuning
from boomerang.operator.api import MAX_NAME_LENGTH, DisaggregatedDeployment
from boomerang.operator.status import compute_status

pytestmark = pytest.mark.cluster

# CEL rules that no resource can violate, with why. Each is a defect to fix in the API (remove
# the rule or widen what it guards); the coverage test fails once an entry here becomes stale.
UNREACHABLE: dict[str, str] = {}


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
    assert code != 0, f"accepted a bad resource:\n{output}"
    for text in (case["field"], case.get("message", "")):
        assert text in output, f"rejection does not mention {text!r}:\n{output}"


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
