"""Whatever the API model admits, the operator can build: a property test over generated resources.

The API server admits what the CRD (generated from the same model) admits, and the e2e suite
checks that the two agree (e2e/test_admission_properties.py); here, fast and with many examples,
that every resource the model admits turns into children without an error, named and labelled
within Kubernetes' limits. A resource the builders refuse, or whose children Kubernetes refuses,
would be admitted and then never converge.
"""

from __future__ import annotations

from typing import Any

from dd_testing import manifest
from hypothesis import HealthCheck, event, example, given, settings
from pydantic import ValidationError
from resources_testing import check_builds, manifests

from boomerang.operator.api import INT32_MAX, MAX_NAME_LENGTH, DisaggregatedDeployment


def _longest(**spec: Any) -> dict[str, Any]:
    data = manifest("minimal")
    data["metadata"]["name"] = "d" * MAX_NAME_LENGTH
    data["spec"].update(spec)
    return data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(_longest(prefill={"replicas": INT32_MAX}, decode={"replicas": INT32_MAX}))
@example(_longest(router={"conversationTTL": "474.999999999s"}))
@given(manifests())
def test_every_admitted_resource_builds_children_that_fit_kubernetes(data: dict[str, Any]) -> None:
    try:
        dd = DisaggregatedDeployment.model_validate(data)
    except ValidationError:
        event("rejected")
        return  # refused at admission too (e2e/test_admission_properties.py)
    event("admitted")
    check_builds(dd)
