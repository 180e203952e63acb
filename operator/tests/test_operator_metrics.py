"""The operator's metrics: each full reconcile counted once by result, errors by reason, the
duration observed, resources by Ready state; through the kopf handlers' own path, and served
over HTTP under the names the chart's alerts and dashboard read."""

from __future__ import annotations

import copy
import socket
import urllib.request
from collections.abc import Mapping
from typing import Any

import pytest
from dd_testing import manifest
from monitoring_testing import rules

from boomerang.operator import handlers, metrics
from boomerang.operator.kube import KubeError
from boomerang.operator.metrics import OperatorMetrics
from boomerang.operator.reconcile import Outcome, StatusGate

READY_TRUE = {"conditions": [{"type": "Ready", "status": "True"}]}
NAMES = (
    "boomerang_operator_reconciles_total",
    "boomerang_operator_reconcile_errors_total",
    "boomerang_operator_reconcile_duration_seconds_bucket",
    "boomerang_operator_resources",
)


def value(m: OperatorMetrics, name: str, **labels: str) -> float:
    found = m.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


class FakeKube:
    """Applies succeed unless the kind is `refuse`; workloads never exist (nothing Ready)."""

    def __init__(self, owner: dict[str, Any], refuse: str | None = None) -> None:
        self.owner, self.refuse = owner, refuse

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        if obj["kind"] == self.refuse:
            raise KubeError("denied by an admission webhook", 403)
        return dict(obj)

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        return dict(obj)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.owner) if kind == "DisaggregatedDeployment" else None

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.owner["status"] = copy.deepcopy(dict(status))

    def apply_status(self, obj: Mapping[str, Any]) -> None:
        pass  # no scalers here

    def list_objects(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        return []  # no nodes, no pods


def resource(name: str = "qwen", **spec: Any) -> dict[str, Any]:
    data = manifest("minimal")
    data["metadata"].update(name=name, namespace="team-a", uid="u-1", generation=1)
    data["spec"].update(spec)
    return data


@pytest.fixture
def wired(monkeypatch: pytest.MonkeyPatch) -> OperatorMetrics:
    """The handlers' module state replaced by fresh metrics and a fresh gate."""
    fresh = OperatorMetrics()
    monkeypatch.setattr(handlers, "METRICS", fresh)
    monkeypatch.setattr(handlers, "_gate", StatusGate())
    return fresh


def use(monkeypatch: pytest.MonkeyPatch, *kubes: FakeKube) -> None:
    """The handlers' API client: each call to `kube()` gets the next of `kubes`, then the last."""
    queue = list(kubes)
    monkeypatch.setattr(handlers, "kube", lambda: queue.pop(0) if len(queue) > 1 else queue[0])


def test_every_result_and_error_reason_is_exported_from_the_start() -> None:
    m = OperatorMetrics()
    for result in metrics.RESULTS:
        assert (
            m.registry.get_sample_value("boomerang_operator_reconciles_total", {"result": result})
            == 0
        )
    for reason in metrics.ERROR_REASONS:
        assert (
            m.registry.get_sample_value(
                "boomerang_operator_reconcile_errors_total", {"reason": reason}
            )
            == 0
        )
    assert value(m, "boomerang_operator_resources", ready="True") == 0


def test_a_successful_reconcile_counts_ok_and_its_duration(
    wired: OperatorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = resource()
    use(monkeypatch, FakeKube(owner))
    handlers._reconcile(owner)
    handlers._reconcile(owner)
    assert value(wired, "boomerang_operator_reconciles_total", result="ok") == 2
    assert value(wired, "boomerang_operator_reconciles_total", result="error") == 0
    assert value(wired, "boomerang_operator_reconcile_duration_seconds_count") == 2
    # No workload exists yet: the resource is not Ready.
    assert value(wired, "boomerang_operator_resources", ready="False") == 1


def test_a_refused_child_counts_an_error_and_an_apply_error(
    wired: OperatorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = resource()
    use(monkeypatch, FakeKube(owner, refuse="NetworkPolicy"))
    handlers._reconcile(owner)
    assert value(wired, "boomerang_operator_reconciles_total", result="error") == 1
    assert value(wired, "boomerang_operator_reconcile_errors_total", reason="apply") == 1
    assert value(wired, "boomerang_operator_reconciles_total", result="ok") == 0


def test_the_next_good_reconcile_counts_ok_again(
    wired: OperatorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = resource()
    use(monkeypatch, FakeKube(owner, refuse="Service"), FakeKube(owner))
    handlers._reconcile(owner)
    handlers._reconcile(owner)
    assert value(wired, "boomerang_operator_reconciles_total", result="error") == 1
    assert value(wired, "boomerang_operator_reconciles_total", result="ok") == 1


def test_an_invalid_spec_counts_invalid_not_error(
    wired: OperatorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = resource(kvTransfer={"recomputeThreshold": -5})
    use(monkeypatch, FakeKube(owner))
    handlers._reconcile(owner)
    assert value(wired, "boomerang_operator_reconciles_total", result="invalid") == 1
    assert value(wired, "boomerang_operator_reconciles_total", result="error") == 0
    assert value(wired, "boomerang_operator_reconcile_errors_total", reason="apply") == 0


def test_a_reconcile_that_raises_counts_an_exception_and_still_raises() -> None:
    m = OperatorMetrics()

    def boom() -> Outcome:
        raise RuntimeError("API server unreachable")

    with pytest.raises(RuntimeError):
        m.reconciled(("a", "b"), boom, lambda: None)
    assert value(m, "boomerang_operator_reconciles_total", result="error") == 1
    assert value(m, "boomerang_operator_reconcile_errors_total", reason="exception") == 1
    assert value(m, "boomerang_operator_reconcile_duration_seconds_count") == 1


def test_resources_are_counted_by_their_latest_ready_state_and_forgotten_when_deleted() -> None:
    m = OperatorMetrics()
    m.observe_status(("ns", "a"), {"conditions": [{"type": "Ready", "status": "False"}]})
    m.observe_status(("ns", "b"), READY_TRUE)
    m.observe_status(("ns", "a"), READY_TRUE)
    m.observe_status(("ns", "b"), {})  # a coalesced refresh computed nothing: no change
    assert value(m, "boomerang_operator_resources", ready="True") == 2
    assert value(m, "boomerang_operator_resources", ready="False") == 0
    m.forget(("ns", "a"))
    m.forget(("ns", "gone"))
    assert value(m, "boomerang_operator_resources", ready="True") == 1


def test_a_deleted_resource_leaves_the_gauge_through_its_event(wired: OperatorMetrics) -> None:
    wired.observe_status(("team-a", "qwen"), READY_TRUE)
    handlers.on_resource_event(event={"type": "DELETED", "object": resource()})
    assert value(wired, "boomerang_operator_resources", ready="True") == 0


def test_the_metrics_are_served_over_http_under_the_names_the_chart_reads() -> None:
    m = OperatorMetrics()
    m.reconciled(("a", "b"), lambda: Outcome(status=READY_TRUE), lambda: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = metrics.serve(m, port, addr="127.0.0.1")
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    for name in NAMES:
        assert name in text
    read_by_alerts = {n for r in rules() for n in NAMES if n.split("_bucket")[0] in r["expr"]}
    assert "boomerang_operator_reconciles_total" in read_by_alerts
    assert metrics.serve(m, 0) is None


def test_the_flags_serve_the_metrics_and_set_the_prometheus_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from boomerang.operator import __main__ as cli
    from boomerang.operator import policy

    monkeypatch.setenv(policy.PROMETHEUS_NAMESPACE_ENV, "")  # restored after the test
    served: list[int] = []
    monkeypatch.setattr(metrics, "serve", lambda m, port: served.append(port))
    monkeypatch.setattr(cli.asyncio, "run", lambda coro: coro.close())
    assert cli.main(["--metrics-namespace", "monitoring", "--metrics-port", "9100"]) == 0
    assert served == [9100]
    assert policy.prometheus_namespace() == "monitoring"
    cli.main([])
    assert served == [9100, metrics.PORT]
