"""The API server and the operator's model agree on what to admit: a property test on generated
resources, each sent to the real API server as a server-side dry-run apply.

Whatever the API server admits, the model must admit and the builders must turn into children
that fit Kubernetes (or the resource would be stored and never converge); equivalently, whatever
the model rejects, the API server must reject too. The model may be the stricter one (it refuses
the nulls the API server prunes, for one). Few examples, derandomized, so CI runs the same ones;
operator/tests/test_admitted_resources_build.py runs many more against the model alone. No
refusal may come from a rule that failed to evaluate (a stray value must meet the rule's own
check or the schema's, never a CEL error).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cluster import Cluster
from hypothesis import HealthCheck, event, given, settings
from pydantic import ValidationError
from resources_testing import check_builds, manifests
from suite import CEL_ERRORS

from boomerang.operator.api import DisaggregatedDeployment

pytestmark = pytest.mark.cluster


def _dry_run_apply(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> tuple[int, str]:
    result = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-",
        input=json.dumps(obj), check=False,
    )  # fmt: skip
    return result.returncode, result.stderr + result.stdout


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=manifests())
def test_what_the_api_server_admits_the_operator_admits_and_builds(
    cluster: Cluster, chart: str, namespace: str, data: dict[str, Any]
) -> None:
    code, output = _dry_run_apply(cluster, namespace, data)
    assert not [e for e in CEL_ERRORS if e in output], f"a rule failed to evaluate:\n{output}"
    try:
        dd = DisaggregatedDeployment.model_validate(data)
    except ValidationError as exc:
        event("rejected by both" if code else "admitted by the API server only")
        assert code != 0, f"the API server admitted what the operator rejects:\n{exc}\n{output}"
        return
    event("admitted by both" if code == 0 else "rejected by the API server only")
    check_builds(dd)
