"""Benchmark: the operator reconciling many DisaggregatedDeployments on a real control plane.

Starts its own control plane (e2e/cluster.py), installs the chart, runs the operator as the
chart's ServiceAccount, then measures:
- time from applying N resources (the minimal sample, renamed) to all of them Ready;
- latency from a spec change to Ready for that generation, one resource at a time, for a scale
  of decode (adds a pod) and a decoder-TTL change (rolls every pod through the config hash);
- the operator's resident memory, sampled throughout.
Readiness is polled from the API server every 0.1s, so latencies have 0.1s resolution.

    python e2e/bench_operator.py [--resources 50] [--changes 20]

Targets (issue 3): all Ready within 60s, p99 change-to-Ready under 5s, operator under 200 MB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster
from kube import is_true
from operator_process import OperatorProcess
from suite import (
    CHART,
    RELEASE,
    RELEASE_NAMESPACE,
    SERVICE_ACCOUNT,
    converged,
    example,
    install_chart,
    patched,
)

NAMESPACE = "bench"
DD_PATH = f"/apis/boomerang.dev/v1alpha1/namespaces/{NAMESPACE}/disaggregateddeployments"
MERGE = "application/merge-patch+json"


class Sampler:
    """Polls all resources and the operator's memory; remembers peak RSS."""

    def __init__(self, cluster: Cluster, operator: OperatorProcess) -> None:
        self.cluster, self.operator = cluster, operator
        self.peak_rss = 0.0

    def poll(self) -> dict[str, dict[str, Any]]:
        self.peak_rss = max(self.peak_rss, self.operator.rss_mib())
        items = self.cluster.request(DD_PATH)["items"]
        return {obj["metadata"]["name"]: obj for obj in items}

    def wait(self, done: Callable[[dict[str, dict[str, Any]]], bool], timeout: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if done(self.poll()):
                return time.monotonic() - start
            time.sleep(0.1)
        raise TimeoutError(f"not converged within {timeout}s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def _all_workloads_exist(cluster: Cluster, count: int) -> bool:
    """The operator's part: every StatefulSet and Deployment of every resource was applied."""
    sts = cluster.request(f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets")["items"]
    deps = cluster.request(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")["items"]
    return len(sts) >= 2 * count and len(deps) >= count


def _all_pods_ready(cluster: Cluster, expected: int) -> bool:
    pods = cluster.request(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    ready = [p for p in pods if is_true(p, "Ready")]
    return len(ready) >= expected


def create_all(cluster: Cluster, sampler: Sampler, count: int) -> dict[str, Any]:
    """Apply `count` resources at once; when each was Ready, and when all their pods were."""
    names = [f"bench-{i:03d}" for i in range(count)]
    objects = [patched(example("minimal.yaml"), "metadata.name", n) for n in names]
    pods_expected = count * 4  # minimal: one prefill, one decode, two router pods
    start = time.monotonic()
    cluster.apply_objects(objects, namespace=NAMESPACE)
    ready_at: dict[str, float] = {}
    milestones: dict[str, float] = {}

    def all_ready(items: dict[str, dict[str, Any]]) -> bool:
        now = time.monotonic() - start
        for name, obj in items.items():
            if name not in ready_at and converged(obj):
                ready_at[name] = now
        polls = milestones["polls"] = milestones.get("polls", 0) + 1
        if "children" not in milestones and _all_workloads_exist(cluster, count):
            milestones["children"] = now
        check_pods = "pods" not in milestones and polls % 5 == 0
        if check_pods and _all_pods_ready(cluster, pods_expected):
            milestones["pods"] = now
        return len(ready_at) == count

    sampler.wait(all_ready, timeout=600)
    return {"each": list(ready_at.values()), "all": max(ready_at.values()), **milestones}


def change_latencies(
    cluster: Cluster, sampler: Sampler, names: list[str], patch_of: Callable[[int], dict[str, Any]]
) -> list[float]:
    """For each resource in turn: merge-patch its spec, time until Ready at the new generation."""
    latencies = []
    for i, name in enumerate(names):
        start = time.monotonic()
        updated = cluster.request(f"{DD_PATH}/{name}", "PATCH", patch_of(i), MERGE)
        generation = updated["metadata"]["generation"]

        def ready(items: dict[str, dict[str, Any]], n: str = name, g: int = generation) -> bool:
            obj = items[n]
            return obj["metadata"]["generation"] == g and converged(obj)

        sampler.wait(ready, timeout=120)
        latencies.append(time.monotonic() - start)
    return latencies


def row(label: str, values: list[float]) -> str:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    mean = statistics.fmean(values)
    return f"| {label} | {len(values)} | {p50:.2f} | {p99:.2f} | {max(values):.2f} | {mean:.2f} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resources", type=int, default=50)
    parser.add_argument("--changes", type=int, default=20, help="changes timed per kind")
    args = parser.parse_args()
    nodes = (args.resources * 2 + 12) // 8 + 1  # one GPU per engine pod in the minimal sample
    workdir = Path(tempfile.mkdtemp(prefix="boomerang-bench-"))
    with Cluster(workdir, nodes=nodes) as cluster:
        install_chart(cluster, CHART, RELEASE, RELEASE_NAMESPACE)
        kubeconfig = cluster.service_account_kubeconfig(
            RELEASE_NAMESPACE, SERVICE_ACCOUNT, workdir / "operator.kubeconfig"
        )
        operator = OperatorProcess(kubeconfig, workdir / "logs" / "operator.log")
        operator.start()
        try:
            cluster.kubectl("create", "namespace", NAMESPACE)
            sampler = Sampler(cluster, operator)
            load = os.getloadavg()[0]
            created = create_all(cluster, sampler, args.resources)
            names = sorted(sampler.poll())[: args.changes]
            scale = change_latencies(
                cluster, sampler, names, lambda i: {"spec": {"decode": {"replicas": 2}}}
            )
            ttl = change_latencies(
                cluster,
                sampler,
                names,
                lambda i: {"spec": {"kvTransfer": {"decoderBlocksTTL": f"{600 + i}s"}}},
            )
            final_rss = operator.rss_mib()
        finally:
            operator.stop()
    print(f"\nOperator benchmark: {args.resources} resources, {nodes} kwok GPU nodes\n")
    print("| measurement | n | p50 s | p99 s | max s | mean s |")
    print("|---|---|---|---|---|---|")
    print(row("create -> Ready (each)", created["each"]))
    print(row("scale decode 1->2 -> Ready", scale))
    print(row("decoder TTL change (rolls pods) -> Ready", ttl))
    pods = created.get("pods", float("nan"))
    print(f"\nall {args.resources} Ready after {created['all']:.1f} s (target < 60 s);")
    children = created.get("children", float("nan"))
    print(f"  all their StatefulSets and Deployments applied after {children:.1f} s")
    print(f"  all {args.resources * 4} of their pods Ready (kwok) after {pods:.1f} s")
    print(f"host load average (1 min) when applying: {load:.1f} on {os.cpu_count()} CPUs")
    rss = f"peak {sampler.peak_rss:.0f} MiB, final {final_rss:.0f} MiB"
    print(f"operator RSS: {rss} (target < 200 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
