"""The chart's monitoring: alerts checked and unit-tested by the real promtool, a dashboard and
rules that read only metrics the components export, and the monitoring objects the chart
renders (off by default) selecting what the operator really creates.

The same rules and panels run against a real Prometheus scraping real engines in
e2e/dataplane/test_prometheus.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_testing import CHART, refused, render_chart
from dd_testing import deployment
from monitoring_testing import (
    ALERTS,
    ALERTS_TEST,
    DASHBOARD,
    dashboard,
    measures,
    panel_queries,
    promtool,
    rules,
)

from boomerang.facts.engine import HTTP_PORT
from boomerang.operator import metrics, render
from boomerang.operator.children import desired_children
from boomerang.router.metrics import Metrics

K8S_VERSION = "1.36.0"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
ALL_ON = tuple(
    arg
    for key in ("serviceMonitor", "podMonitor", "prometheusRule", "grafanaDashboard")
    for arg in ("--set", f"monitoring.{key}.enabled=true")
)
# vLLM's names, as its CPU build exports them (the e2e test scrapes them from real engines).
VLLM_NAMES = {
    "vllm:prompt_tokens_by_source_total",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
}


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _exported(registry: Any) -> set[str]:
    """Every series name a registry exports, also for labelled metrics not yet observed."""
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in _SUFFIXES.get(family.type, ("",))
    }


def _metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (identifiers followed by `{`)."""
    return set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))


# -- alerts -----------------------------------------------------------------------------------


def test_promtool_accepts_the_alert_rules() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_fires_and_stays_quiet_where_promtool_tests_it() -> None:
    out = subprocess.run(
        [promtool(), "test", "rules", ALERTS_TEST.name],
        cwd=ALERTS_TEST.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    cases = [
        case
        for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for rule in rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']} never tested firing"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']} never tested quiet"


def test_every_alert_is_measures_with_thresholds_a_severity_and_an_explanation() -> None:
    for rule in rules():
        assert measures(rule["expr"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert rule["alert"] in (CHART / "docs" / "README.md").read_text(), (
            f"{rule['alert']} is not explained in charts/boomerang/docs/README.md"
        )


def test_the_measure_of_a_clause_is_the_clause_without_its_threshold() -> None:
    expr = "sum(rate(a_total[5m]))\n  / sum(rate(b_total[5m]))\n  < 0.5\nand\nc\n  >= 20\n"
    assert measures(expr) == ["sum(rate(a_total[5m]))\n  / sum(rate(b_total[5m]))", "c"]
    with pytest.raises(AssertionError):
        measures("a > b")


# -- what the rules and the dashboard read ----------------------------------------------------


def test_rules_and_panels_read_only_metrics_the_components_export() -> None:
    known = _exported(Metrics().registry) | _exported(metrics.OperatorMetrics().registry)
    known |= VLLM_NAMES
    exprs = [m for r in rules() for m in measures(r["expr"])]
    exprs += [e for queries in panel_queries().values() for e in queries]
    for expr in exprs:
        unknown = _metric_names(expr) - known
        assert not unknown, f"{unknown} in {expr}"


def test_dashboard_panels_are_wired_to_the_chosen_data_source() -> None:
    data = dashboard()
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in data["templating"]["list"]}
    assert variables == {"datasource", "namespace", "deployment"}
    for panel in data["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    titles = set(panel_queries())
    for needed in (
        "Reuse hit share of turns with a handle",
        "Time to first token by reuse outcome (router)",
        "Prompt tokens on prefill, by source",
        "KV cache usage",
        "Reconciles by result",
        "Reconcile errors by reason",
        "Reconcile duration",
    ):
        assert needed in titles  # fmt: skip


# -- the chart --------------------------------------------------------------------------------


def _one(docs: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name)]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in found])
    return found[0]


def test_monitoring_is_off_by_default(helm: Path) -> None:
    docs = render_chart(helm)
    assert not {d["kind"] for d in docs} & MONITORING_KINDS
    assert not [d for d in docs if d["metadata"]["name"].endswith(("-metrics", "-dashboard"))]
    args = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--metrics-namespace")]


def test_the_service_monitor_scrapes_the_operators_metrics_port(helm: Path) -> None:
    docs = render_chart(helm, *ALL_ON, "--set", "monitoring.labels.release=kps")
    service, monitor = _one(docs, "Service", "-metrics"), _one(docs, "ServiceMonitor")
    kubernetes_validate.validate(service, K8S_VERSION, strict=True)
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": metrics.PORT, "targetPort": metrics.PORT, "protocol": "TCP"}
    ]
    pod_labels = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    for kind in MONITORING_KINDS:
        assert _one(docs, kind)["metadata"]["labels"]["release"] == "kps"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(e["key"]) in e["values"] for e in selector["matchExpressions"])


def test_the_pod_monitor_selects_every_router_and_engine_pod_the_operator_creates(
    helm: Path,
) -> None:
    monitor = _one(render_chart(helm, *ALL_ON), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    selector = monitor["spec"]["selector"]
    dd = deployment("minimal")
    pods = [
        o["spec"]["template"]
        for o in desired_children(dd)
        if o["kind"] in ("StatefulSet", "Deployment")
    ]
    assert len(pods) == 3
    for pod in pods:
        assert _selects(selector, pod["metadata"]["labels"])
        ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        assert endpoint["port"] in ports
    assert {HTTP_PORT, render.ROUTER_PORT} == {
        {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}["http"]
        for pod in pods
    }
    assert endpoint["path"] == "/metrics"
    # Other pods carrying some of the labels are left alone.
    assert not _selects(selector, {**render.labels(dd, "router"), render.LABEL_ROLE: "redis"})
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    # Prometheus' name for a pod label: every character outside [a-zA-Z0-9_] becomes `_`.
    assert relabel == {
        "deployment": [_discovered(render.LABEL_DEPLOYMENT)],
        "component": [_discovered(render.LABEL_ROLE)],
    }


def _discovered(label: str) -> str:
    """The meta label Prometheus' Kubernetes discovery gives a pod label."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def test_the_pod_monitor_follows_the_watched_namespaces(helm: Path) -> None:
    docs = render_chart(helm, *ALL_ON, "--set", "watchNamespaces={team-a,team-b}")
    monitor = _one(docs, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    docs = render_chart(helm, *ALL_ON, "--set", "monitoring.podMonitor.namespaces={llm}")
    assert _one(docs, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}


def test_the_prometheus_rule_and_the_dashboard_are_the_committed_files(helm: Path) -> None:
    docs = render_chart(helm, *ALL_ON, "--set", "monitoring.grafanaDashboard.labels.team=ml")
    rule = _one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    config_map = _one(docs, "ConfigMap", "-dashboard")
    kubernetes_validate.validate(config_map, K8S_VERSION, strict=True)
    assert json.loads(config_map["data"]["boomerang.json"]) == json.loads(DASHBOARD.read_text())
    assert config_map["metadata"]["labels"]["team"] == "ml"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_prometheus_namespace_reaches_the_operator_flag(helm: Path) -> None:
    docs = render_chart(helm, "--set", "monitoring.prometheusNamespace=monitoring")
    args = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--metrics-namespace=monitoring" in args


def test_the_values_schema_rejects_a_monitoring_typo(helm: Path) -> None:
    assert "enable" in refused(helm, "--set", "monitoring.serviceMonitor.enable=true")
