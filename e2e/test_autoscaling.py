"""Per-role autoscaling through `DisaggregatedRoleScaler`, on the real control plane.

- `kubectl scale` on decode's scaler resizes decode's StatefulSet through the real scale
  subresource; the deployment's own spec (and generation) stay untouched, and invalid scalers
  are refused at admission naming the field.
- The real HPA controller of kube-controller-manager scales decode through the scaler on an
  external metric: a small exporter serves vLLM's `vllm:num_requests_waiting` for the decode
  pods (kwok pods run no engine), a real Prometheus scrapes it every second, and
  prometheus-adapter (built by `make tools` from its Go module) serves it as an external metric
  behind the apiserver's aggregation layer, with the rule charts/boomerang/docs/autoscaling.yaml
  gives users.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import Cluster
from kube import free_port, wait_until
from monitoring_testing import promtool
from operator_process import OperatorProcess
from procs import stop_process
from suite import CEL_ERRORS, apply, example, get_dd, patched, wait_ready

pytestmark = pytest.mark.cluster

SCALERS = "disaggregatedrolescalers.boomerang.dev"
ADAPTER = "prometheus-adapter"
APISERVICE = "v1beta1.external.metrics.k8s.io"
METRIC = "boomerang_requests_waiting"
ADAPTER_RULES = {
    "externalRules": [
        {
            "seriesQuery": 'vllm:num_requests_waiting{namespace!="",deployment!="",component!=""}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "name": {"matches": "^vllm:num_requests_waiting$", "as": METRIC},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>})",
        }
    ]
}
"""The external rule charts/boomerang/docs/autoscaling.yaml documents (a test holds them equal)."""


def scaled_minimal(decode_replicas: int = 1) -> dict[str, Any]:
    manifest = example("minimal.yaml")
    manifest = patched(manifest, "spec.decode.replicas", decode_replicas)
    return patched(manifest, "spec.decode.replicasFrom", "Scaler")


def sts(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get_json("statefulset", name, "-n", namespace)


def wait_decode(cluster: Cluster, namespace: str, replicas: int, timeout: float = 120) -> float:
    """Wait until decode's StatefulSet has `replicas` ready pods; seconds it took."""
    start = time.monotonic()

    def ready() -> bool:
        status = sts(cluster, namespace, "minimal-decode").get("status") or {}
        spec = sts(cluster, namespace, "minimal-decode")["spec"]
        return spec["replicas"] == replicas and status.get("readyReplicas") == replicas

    wait_until(f"decode at {replicas} ready", ready, timeout=timeout, interval=0.3)
    return time.monotonic() - start


def scaler_ready(cluster: Cluster, namespace: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = cluster.get_json(SCALERS, "minimal-decode", "-n", namespace)
        return obj if (obj.get("status") or {}).get("selector") else None

    return wait_until("decode's scaler and its status", probe, timeout=60)


def test_kubectl_scale_resizes_decode_and_leaves_the_spec_alone(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply(cluster, scaled_minimal(), namespace)
    before = wait_ready(cluster, namespace, "minimal")
    scaler = scaler_ready(cluster, namespace)
    assert scaler["spec"] == {"deploymentName": "minimal", "role": "decode", "replicas": 1}
    assert scaler["metadata"]["ownerReferences"][0]["name"] == "minimal"
    assert before["status"]["decode"]["scaler"] == "DisaggregatedRoleScaler/minimal-decode"

    cluster.kubectl("scale", SCALERS, "minimal-decode", "--replicas=3", "-n", namespace)
    took = wait_decode(cluster, namespace, 3)
    after = wait_ready(cluster, namespace, "minimal")
    print(f"kubectl scale 1 -> 3: decode ready in {took:.1f}s")
    assert after["spec"]["decode"]["replicas"] == 1  # the parent's spec is not the owner
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["status"]["decode"]["desired"] == 3
    scale = json.loads(
        cluster.kubectl(
            "get", "--raw",
            f"/apis/boomerang.dev/v1alpha1/namespaces/{namespace}/disaggregatedrolescalers/"
            "minimal-decode/scale",
        ).stdout
    )  # fmt: skip
    assert scale["spec"]["replicas"] == 3
    assert wait_until(
        "scale status",
        lambda: (
            cluster.get_json(SCALERS, "minimal-decode", "-n", namespace)["status"]["replicas"] == 3
        ),
    )
    assert (
        scale["status"]["selector"] == "boomerang.dev/deployment=minimal,boomerang.dev/role=decode"
    )
    # prefill stays on its spec: no scaler of its own.
    listed = cluster.get_json(SCALERS, "-n", namespace)["items"]
    assert [o["metadata"]["name"] for o in listed] == ["minimal-decode"]

    # A scaler deleted by hand comes back at the role's live size, not the spec's.
    cluster.kubectl("delete", SCALERS, "minimal-decode", "-n", namespace)
    back = wait_until(
        "the scaler recreated",
        lambda: (
            cluster.kubectl(
                "get", SCALERS, "minimal-decode", "-n", namespace, "-o", "json", check=False
            ).stdout
        ),
        timeout=90,
    )
    assert json.loads(back)["spec"]["replicas"] == 3
    assert sts(cluster, namespace, "minimal-decode")["spec"]["replicas"] == 3


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"spec": {"replicas": 0}}, "spec.replicas"),
        ({"spec": {"role": "router"}}, "spec.role"),
        ({"metadata": {"name": "other"}}, "metadata.name"),
    ],
    ids=["zero-replicas", "unknown-role", "name-not-deployment-role"],
)
def test_invalid_scalers_are_refused_at_admission_naming_the_field(
    cluster: Cluster, chart: str, namespace: str, change: dict[str, Any], field: str
) -> None:
    obj: dict[str, Any] = {
        "apiVersion": "boomerang.dev/v1alpha1",
        "kind": "DisaggregatedRoleScaler",
        "metadata": {"name": "minimal-decode", **change.get("metadata", {})},
        "spec": {"deploymentName": "minimal", "role": "decode", "replicas": 1,
                 **change.get("spec", {})},
    }  # fmt: skip
    result = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False
    )
    assert result.returncode != 0
    assert field in result.stderr, result.stderr
    assert not [e for e in CEL_ERRORS if e in result.stderr], result.stderr


def test_a_scaler_s_role_is_immutable(cluster: Cluster, chart: str, namespace: str) -> None:
    obj = {
        "apiVersion": "boomerang.dev/v1alpha1",
        "kind": "DisaggregatedRoleScaler",
        "metadata": {"name": "minimal-decode"},
        "spec": {"deploymentName": "minimal", "role": "decode", "replicas": 1},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))
    result = cluster.kubectl(
        "patch", SCALERS, "minimal-decode", "-n", namespace, "--type=merge",
        "-p", '{"spec":{"role":"prefill"}}', check=False,
    )  # fmt: skip
    assert result.returncode != 0 and "spec.role is immutable" in result.stderr, result.stderr
    zero = cluster.kubectl(
        "scale", SCALERS, "minimal-decode", "--replicas=0", "-n", namespace, check=False
    )
    assert zero.returncode != 0 and "spec.replicas" in zero.stderr, zero.stderr


# The HPA path -----------------------------------------------------------------------------


class Exporter:
    """Serves `vllm:num_requests_waiting` (a gauge vLLM exports) with a value the test sets."""

    def __init__(self) -> None:
        self.waiting = 0.0
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f"vllm:num_requests_waiting {exporter.waiting}\n"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def _adapter_binary(cluster: Cluster) -> Path:
    path = cluster.binaries / ADAPTER
    if not os.access(path, os.X_OK):
        message = f"{ADAPTER} missing in {cluster.binaries}: run `make tools`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _start_prometheus(workdir: Path, target: str, namespace: str) -> tuple[Any, str]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "decode-engines",
                "static_configs": [
                    {
                        "targets": [target],
                        "labels": {"namespace": namespace, "deployment": "minimal",
                                   "component": "decode"},
                    }
                ],
            }
        ],
    }  # fmt: skip
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc = _spawn(
        [promtool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
         f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        workdir / "prometheus.log",
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def _register(cluster: Cluster, port: int) -> None:
    """The APIService and an ExternalName Service that points the aggregator at the adapter
    on loopback (no kube-proxy here; the aggregator dials an ExternalName's host directly)."""
    cluster.kubectl("create", "namespace", "boomerang-metrics", check=False)
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": ADAPTER, "namespace": "boomerang-metrics"},
        "spec": {"type": "ExternalName", "externalName": "127.0.0.1",
                 "ports": [{"name": "https", "port": port}]},
    }  # fmt: skip
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": APISERVICE},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                 "service": {"namespace": "boomerang-metrics", "name": ADAPTER, "port": port},
                 "insecureSkipTLSVerify": True, "groupPriorityMinimum": 100,
                 "versionPriority": 100},
    }  # fmt: skip
    cluster.apply_objects([service, apiservice])


@pytest.fixture
def metrics_api(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[tuple[Exporter, str]]:
    """Exporter -> Prometheus -> adapter -> external.metrics.k8s.io; yields the exporter and
    the metrics API path of the test's namespace."""
    adapter = _adapter_binary(cluster)
    exporter = Exporter()
    prometheus, prom_url = _start_prometheus(tmp_path, exporter.address, namespace)
    port = free_port()
    kubeconfig = str(cluster.kubeconfig)
    (tmp_path / "adapter.yaml").write_text(yaml.safe_dump(ADAPTER_RULES))
    adapter_proc = _spawn(
        [str(adapter), f"--secure-port={port}", "--bind-address=127.0.0.1",
         f"--cert-dir={tmp_path / 'adapter-certs'}", f"--lister-kubeconfig={kubeconfig}",
         f"--authentication-kubeconfig={kubeconfig}",
         f"--authorization-kubeconfig={kubeconfig}", f"--prometheus-url={prom_url}",
         f"--config={tmp_path / 'adapter.yaml'}", "--metrics-relist-interval=2s", "--v=2"],
        cluster.workdir / "logs" / "prometheus-adapter.log",
    )  # fmt: skip
    try:
        _register(cluster, port)
        yield exporter, f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{METRIC}"
    finally:
        # The APIService first: an unavailable aggregated API would stall namespace deletion
        # (discovery fails) for every later test.
        cluster.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)
        stop_process(adapter_proc, 15, 10)
        stop_process(prometheus, 15, 10)
        exporter.close()


def _hpa(namespace: str) -> dict[str, Any]:
    fast = {"stabilizationWindowSeconds": 0,
            "policies": [{"type": "Pods", "value": 4, "periodSeconds": 1}]}  # fmt: skip
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "minimal-decode", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "boomerang.dev/v1alpha1",
                               "kind": "DisaggregatedRoleScaler", "name": "minimal-decode"},
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [{"type": "External", "external": {
                "metric": {"name": METRIC, "selector": {"matchLabels": {
                    "deployment": "minimal", "component": "decode"}}},
                "target": {"type": "AverageValue", "averageValue": "4"}}}],
            "behavior": {"scaleUp": fast, "scaleDown": fast},
        },
    }  # fmt: skip


def _served_value(cluster: Cluster, path: str, selector: str) -> float | None:
    raw = cluster.kubectl("get", "--raw", f"{path}?labelSelector={selector}", check=False)
    if raw.returncode != 0:
        return None
    items = json.loads(raw.stdout).get("items") or []
    if not items:
        return None
    value = str(items[0]["value"])  # a quantity: "2", or "1500m" for 1.5
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


@pytest.mark.timeout(600)
def test_the_hpa_controller_scales_decode_on_a_prometheus_metric(
    cluster: Cluster,
    operator: OperatorProcess,
    namespace: str,
    metrics_api: tuple[Exporter, str],
) -> None:
    exporter, path = metrics_api
    selector = "deployment%3Dminimal,component%3Ddecode"
    apply(cluster, scaled_minimal(), namespace)
    wait_ready(cluster, namespace, "minimal")
    scaler_ready(cluster, namespace)

    exporter.waiting = 2  # 2 waiting over 1 pod: below 4 per pod, no scale
    served = wait_until(
        "the metric through the aggregated API",
        lambda: _served_value(cluster, path, selector) == 2,
        timeout=120,
        interval=1,
    )
    assert served
    cluster.apply_objects([_hpa(namespace)], namespace=namespace)

    def hpa_active() -> bool:
        hpa = cluster.get_json("hpa", "minimal-decode", "-n", namespace)
        conditions = {
            c["type"]: c["status"] for c in (hpa.get("status") or {}).get("conditions", [])
        }
        return conditions.get("ScalingActive") == "True"

    wait_until("the HPA reading the metric", hpa_active, timeout=120, interval=1)
    assert sts(cluster, namespace, "minimal-decode")["spec"]["replicas"] == 1

    exporter.waiting = 14  # 14 waiting / 4 per pod -> 4 decode pods
    up = wait_decode(cluster, namespace, 4, timeout=180)
    dd = wait_ready(cluster, namespace, "minimal")
    assert dd["status"]["decode"]["desired"] == 4 and dd["spec"]["decode"]["replicas"] == 1
    scaler = cluster.get_json(SCALERS, "minimal-decode", "-n", namespace, "--show-managed-fields")
    assert scaler["spec"]["replicas"] == 4
    hpa = cluster.get_json("hpa", "minimal-decode", "-n", namespace)
    assert hpa["status"]["desiredReplicas"] == 4

    exporter.waiting = 1  # 1 waiting -> back to 1 pod
    down = wait_decode(cluster, namespace, 1, timeout=180)
    print(f"HPA on {METRIC}: decode 1 -> 4 ready in {up:.1f}s, 4 -> 1 in {down:.1f}s")
    assert get_dd(cluster, namespace, "minimal")["spec"]["decode"]["replicas"] == 1
    # The HPA controller wrote replicas through the scale subresource, the operator never did.
    writers = {
        (e["manager"], e.get("subresource", ""))
        for e in scaler["metadata"]["managedFields"]
        if "f:replicas" in e.get("fieldsV1", {}).get("f:spec", {})
    }
    assert writers == {("kube-controller-manager", "scale")}, writers


def test_the_documented_adapter_rule_is_the_tested_one() -> None:
    doc = (
        Path(__file__).resolve().parents[1] / "charts/boomerang/docs/autoscaling.yaml"
    ).read_text()
    comment = "\n".join(
        line.removeprefix("#   ") for line in doc.splitlines() if line.startswith("#   ")
    )
    assert yaml.safe_load(comment) == ADAPTER_RULES
