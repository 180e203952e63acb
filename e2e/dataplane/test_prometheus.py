"""The chart's alerts and dashboard against a real Prometheus scraping the real stack.

A `prometheus` process scrapes, every second, a router and both vLLM CPU engines (labelled
`deployment` and `component` as the chart's PodMonitor labels them), a second router whose
engines do not exist (deployment `broken`: no ready engine, every turn a 5xx) and the operator's
metrics served in-process, and loads `charts/boomerang/files/alerts.yaml`. After a conversation
whose later turns reuse D's KV, every dashboard query and every alert's measures (each clause
without its threshold) must return data, the rules must evaluate without error, and the alerts
this situation calls for must hold for `broken` and not for the healthy deployment.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from dataplane.turns import router_completion, words
from monitoring_testing import ALERTS, measures, panel_queries, promtool, rules

from boomerang.local import pdclient
from boomerang.operator import metrics
from boomerang.operator.reconcile import Outcome

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
DEAD_ENGINE = "http://127.0.0.1:9"  # the discard port: nothing listens, connects are refused
WINDOW = "5m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prometheus:
    url: str

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.query(expr)
            if found:
                return found
            time.sleep(1.0)
        raise AssertionError(f"no data for {expr} after {timeout:.0f}s")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return promtool("prometheus")


@pytest.fixture(scope="module")
def operator_metrics() -> Iterator[tuple[metrics.OperatorMetrics, str]]:
    """The operator's metrics, served in-process, and their address."""
    m = metrics.OperatorMetrics()
    port = free_port()
    server = metrics.serve(m, port, addr="127.0.0.1")
    assert server is not None
    yield m, f"127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def reconcile_once(m: metrics.OperatorMetrics, name: str, error: str | None) -> None:
    ready = {"conditions": [{"type": "Ready", "status": "False" if error else "True"}]}
    m.reconciled(("llm", name), lambda: Outcome(status=ready), lambda: error)


def _target(address: str, deployment: str, component: str) -> dict[str, Any]:
    return {"targets": [address], "labels": {"deployment": deployment, "component": component}}


@pytest.fixture(scope="module")
def stack(prometheus_binary, dataplane, operator_metrics, tmp_path_factory) -> Iterator[Any]:
    """(router URL, broken router URL, Prometheus) with every target up."""
    router = dataplane.router("router-monitoring")
    broken = dataplane.router(
        "router-broken", prefill={"urls": [DEAD_ENGINE]}, decode={"urls": [DEAD_ENGINE]}
    )
    name = dataplane.dd.name
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "boomerang",
                "static_configs": [
                    _target(host(router), name, "router"),
                    _target(host(dataplane.p_url), name, "prefill"),
                    _target(host(dataplane.d_url), name, "decode"),
                    _target(host(broken), "broken", "router"),
                ],
            },
            {"job_name": "operator", "static_configs": [{"targets": [operator_metrics[1]]}]},
        ],
    }
    workdir = tmp_path_factory.mktemp("prometheus")
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [prometheus_binary, f"--config.file={workdir / 'prometheus.yml'}",
         f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        _wait_targets_up(prom, proc, workdir / "prometheus.log", expected=5)
        yield router, broken, prom
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def host(url: str) -> str:
    return url.removeprefix("http://")


def _wait_targets_up(prom: Prometheus, proc: subprocess.Popen[bytes], log: Path, expected: int):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"prometheus exited:\n{log.read_text()[-3000:]}"
        try:
            targets = prom.get("/api/v1/targets")["activeTargets"]
        except (urllib.error.URLError, ConnectionError):
            targets = []
        if len(targets) == expected and all(t["health"] == "up" for t in targets):
            return
        time.sleep(1.0)
    raise AssertionError(f"targets not all up: {targets}\n{log.read_text()[-3000:]}")


def _served_5xx(url: str, model: str) -> int:
    body = {**pdclient.completion_body(model, [11, 12, 13], 4), "conversation_id": "broken"}
    try:
        pdclient.post(f"{url}/v1/completions", body, timeout=60)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


@pytest.fixture(scope="module")
def scraped(stack, dataplane, operator_metrics) -> Prometheus:
    """A conversation through the router, 5xx from the broken one, reconciles, all scraped.

    Counters rise only after Prometheus has seen them (a series that first appears at 1 has no
    rate): the broken router's 5xx series is scraped once before its second 5xx."""
    router, broken, prom = stack
    reconcile_once(operator_metrics[0], "qwen", None)
    reconcile_once(operator_metrics[0], "bad", "applying Service bad-router: denied")
    rng = random.Random("monitoring")
    prompt = words(rng, 300)
    for turn in range(3):
        tokens, _, _ = router_completion(router, dataplane.model, prompt, "mon", stream=turn == 1)
        prompt = prompt + tokens + words(rng, 100)
    assert _served_5xx(broken, dataplane.model) >= 500
    prom.wait_for('boomerang_router_requests_total{deployment="broken", outcome="unavailable"}')
    assert _served_5xx(broken, dataplane.model) >= 500
    prom.wait_for('boomerang_router_reuse_total{outcome="hit"} >= 2')
    prom.wait_for('vllm:prompt_tokens_by_source_total{component="prefill", '
                  'source="external_kv_transfer"} > 0')  # fmt: skip
    prom.wait_for(
        'boomerang_router_requests_total{deployment="broken", outcome="unavailable"} >= 2'
    )
    prom.wait_for('boomerang_operator_reconciles_total{result="error"} > 0')
    prom.wait_for('boomerang_router_endpoints{deployment="broken", state="known"} > 0')
    time.sleep(3.0)  # a few more scrapes after the last change, for rate()
    return prom


def test_every_dashboard_query_returns_data(scraped: Prometheus) -> None:
    empty = [
        (title, expr)
        for title, exprs in panel_queries(WINDOW).items()
        for expr in exprs
        if not scraped.query(expr)
    ]
    assert not empty, empty


def test_the_dashboard_shows_reuse_and_the_tokens_pulled_back_from_decode(
    scraped: Prometheus,
) -> None:
    queries = panel_queries(WINDOW)
    (share,) = scraped.query(queries["Reuse hit share of turns with a handle"][0])
    assert float(share["value"][1]) == 1.0  # two later turns, both hits
    by_source = {
        s["metric"]["source"]: float(s["value"][1])
        for s in scraped.query(queries["Prompt tokens on prefill, by source"][0])
    }
    assert by_source["external_kv_transfer"] > 0


def test_every_alert_measure_returns_data_and_every_rule_evaluates(scraped: Prometheus) -> None:
    empty = [
        (rule["alert"], measure)
        for rule in rules()
        for measure in measures(rule["expr"])
        if not scraped.query(measure)
    ]
    assert not empty, empty
    time.sleep(2.0)  # at least one evaluation after the data arrived
    loaded = [r for g in scraped.get("/api/v1/rules")["groups"] for r in g["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(r["alert"] for r in rules())
    assert all(r["health"] == "ok" for r in loaded), [
        (r["name"], r.get("lastError")) for r in loaded
    ]


def test_the_broken_deployment_trips_its_alerts_and_the_healthy_one_does_not(
    scraped: Prometheus, dataplane
) -> None:
    exprs = {r["alert"]: r["expr"] for r in rules()}
    for alert in ("BoomerangEnginesNotReady", "BoomerangRouterErrors"):
        tripped = {s["metric"].get("deployment") for s in scraped.query(exprs[alert])}
        assert "broken" in tripped and dataplane.dd.name not in tripped, (alert, tripped)
    roles = {s["metric"]["role"] for s in scraped.query(exprs["BoomerangEnginesNotReady"])}
    assert roles == {"prefill", "decode"}
    # A refused child: the operator's alert condition holds.
    (errors,) = scraped.query(exprs["BoomerangOperatorReconcileErrors"])
    assert errors["metric"]["result"] == "error"
