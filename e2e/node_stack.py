"""The whole product on the real node, the way a user installs it: what test_node_stack.py shares.

Images built from our Dockerfiles (images/build.py) are imported into the node's containerd;
the chart is installed with helm, so the operator runs in a pod under the chart's
ServiceAccount with in-cluster config; Redis comes from the manifest users are given
(charts/boomerang/docs/redis.yaml); the CPU sample (examples/cpu.yaml) is applied with kubectl,
so the operator renders P and D StatefulSets whose pods run vLLM in containers and a router
Deployment whose pods find them through EndpointSlices. Clients call the router's Service
(kube-proxy) from the host; the engines are scraped at their pod IPs, which the host reaches
over the harness's bridge.

Only what this machine lacks is replaced, and only by a build argument or an image field: the
images' bases are local builds (there is no registry; each image is also tagged with its
published name, which the chart's and the CRD's defaults use), the sample names the local
connector image (the published one is vLLM's CUDA build), Redis runs a local build of Debian's
redis-server in place of the official image, and the sample's Redis URL names the Service's
ClusterIP (the harness runs no cluster DNS).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from cluster import Cluster
from images.build import NAMES, Built
from images.containerd import import_images
from kube import is_true, wait_until
from suite import CHART, RELEASE, RELEASE_NAMESPACE, example

from boomerang.facts.engine import HTTP_PORT
from boomerang.local import pdclient
from boomerang.operator.render import ROUTER_PORT

SAMPLE = "cpu.yaml"
REDIS_MANIFEST = CHART / "docs" / "redis.yaml"
IMAGES = (*NAMES, "redis")


@dataclass
class Stack:
    """The installed product: where its parts are, and how to wait for and reach them."""

    cluster: Cluster
    namespace: str
    images: dict[str, Built]
    manifest: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def model(self) -> str:
        return str(self.manifest["spec"]["model"]["servedName"])

    # Install ----------------------------------------------------------------------------------
    def import_images(self) -> None:
        node = self.cluster.node
        assert node is not None
        started = time.monotonic()
        import_images([self.images[n] for n in IMAGES], node.socket, namespace="k8s.io")
        self.timings["import images"] = time.monotonic() - started

    def helm_install(self) -> str:
        """With the chart's defaults: its operator image is the published name, which the
        import gave to the local build."""
        started = time.monotonic()
        out = self.cluster.helm(
            "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
            "--create-namespace", "--wait", "--timeout", "5m", timeout=360,
        ).stdout  # fmt: skip
        self.timings["helm install (operator Ready)"] = time.monotonic() - started
        return out

    def install_redis(self) -> str:
        """The documented Redis manifest with the local image; returns its Service's URL."""
        docs = [d for d in yaml.safe_load_all(REDIS_MANIFEST.read_text()) if d]
        for doc in docs:
            if doc["kind"] == "Deployment":
                container = doc["spec"]["template"]["spec"]["containers"][0]
                container["image"] = self.images["redis"].ref
                container["imagePullPolicy"] = "Never"
        self.cluster.apply_objects(docs, namespace=self.namespace)
        self.cluster.kubectl(
            "rollout", "status", "deployment/boomerang-redis", "-n", self.namespace,
            "--timeout=180s", timeout=200,
        )  # fmt: skip
        ip = self.service_ip("boomerang-redis")
        return f"redis://{ip}:6379/0"

    def apply_sample(self, redis_url: str) -> dict[str, Any]:
        manifest = example(SAMPLE)
        spec = manifest["spec"]
        spec["engine"]["image"] = self.images["connector"].ref
        spec["engine"]["imagePullPolicy"] = "Never"
        spec["router"]["store"]["url"] = redis_url
        self.manifest = manifest
        self.apply(manifest)
        return manifest

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.apply_objects([manifest], namespace=self.namespace)

    # Waiting ----------------------------------------------------------------------------------
    def get(self) -> dict[str, Any]:
        return self.cluster.get_json(
            "disaggregateddeployments.boomerang.dev", self.name, "-n", self.namespace
        )

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Ready for the current generation (see suite.converged), with the status on failure."""

        def probe() -> dict[str, Any] | None:
            obj = self.get()
            status = obj.get("status") or {}
            current = status.get("observedGeneration") == obj["metadata"]["generation"]
            return obj if current and is_true(obj, "Ready") else None

        try:
            return wait_until(f"{self.name} Ready", probe, timeout=timeout, interval=1.0)
        except TimeoutError as exc:
            status = json.dumps(self.get().get("status"), indent=1)
            raise TimeoutError(f"{exc}\nstatus: {status}\n{self.describe()}") from None

    def describe(self) -> str:
        """Pods, their phases and the last events: what a failed wait reports."""
        pods = self.cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
        events = self.cluster.kubectl(
            "get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp", check=False
        ).stdout
        return f"{pods}\n{events[-4000:]}"

    # Reaching the parts -----------------------------------------------------------------------
    def pods(self, component: str, namespace: str | None = None) -> list[dict[str, Any]]:
        out = self.cluster.get_json(
            "pods", "-n", namespace or self.namespace,
            "-l", f"boomerang.dev/deployment={self.name},boomerang.dev/role={component}",
        )  # fmt: skip
        return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self, component: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(component) if is_true(p, "Ready")]

    def operator_pods(self) -> list[dict[str, Any]]:
        out = self.cluster.get_json(
            "pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/name=boomerang"
        )
        return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]

    def operator_leader(self) -> dict[str, Any]:
        """The operator pod that leads: the highest priority among the live peers in kopf's
        peering object (each replica's identity is its pod name)."""
        peering = self.cluster.get_json("clusterkopfpeerings.kopf.dev", "boomerang-operator")
        peers = peering.get("status") or {}
        pods = {p["metadata"]["name"]: p for p in self.operator_pods()}
        live = {name: peer for name, peer in peers.items() if name in pods}
        if not live:
            raise LookupError(f"no live peer among {sorted(peers)} (pods: {sorted(pods)})")
        leader = max(live, key=lambda name: int(live[name].get("priority", 0)))
        return pods[leader]

    def service_ip(self, name: str) -> str:
        svc = self.cluster.get_json("service", name, "-n", self.namespace)
        return str(svc["spec"]["clusterIP"])

    @property
    def router_url(self) -> str:
        """The router's Service: clients' entry point, through kube-proxy."""
        return f"http://{self.service_ip(f'{self.name}-router')}"

    def engine_url(self, role: str) -> str:
        (pod,) = self.ready_pods(role)
        return f"http://{pod['status']['podIP']}:{HTTP_PORT}"

    def router_urls(self) -> list[str]:
        return [f"http://{p['status']['podIP']}:{ROUTER_PORT}" for p in self.ready_pods("router")]

    def routers_see(self, role: str, ready: int) -> bool:
        """Every router replica counts `ready` engines of `role` ready (its discovery and
        probes caught up with the cluster)."""
        line = f'boomerang_router_endpoints{{role="{role}",state="ready"}} {float(ready)}'
        urls = self.router_urls()
        return bool(urls) and all(line in pdclient.scrape(url) for url in urls)

    def wait_routers_see_both(self, timeout: float, interval: float = 0.5) -> None:
        """Wait until every router replica counts one P and one D ready. The resource is Ready
        when its pods are; a replica's first probe of a new engine (every 5 s) may come after."""
        wait_until(
            "every router replica counts one P and one D ready",
            lambda: self.routers_see("prefill", 1) and self.routers_see("decode", 1),
            timeout=timeout,
            interval=interval,
        )

    def reference(self) -> SimpleNamespace:
        """What dataplane.turns' single-engine reference takes: P alone, without transfer."""
        return SimpleNamespace(p_url=self.engine_url("prefill"), model=self.model)

    def reuse(self) -> dict[str, float]:
        """Every router replica's reuse outcomes, summed (a turn lands on either)."""
        from dataplane.turns import reuse

        total: dict[str, float] = {}
        for url in self.router_urls():
            for outcome, n in reuse(url).items():
                total[outcome] = total.get(outcome, 0.0) + n
        return total

    def pulled_tokens(self) -> float:
        """P's prompt tokens that came from D (`external_kv_transfer`)."""
        return pdclient.external_tokens(pdclient.scrape(self.engine_url("prefill")))


def node_logs(cluster: Cluster, out: Path) -> None:
    """Every pod's log into `out` (kept with the test's temp files for a failure's post-mortem)."""
    out.mkdir(parents=True, exist_ok=True)
    pods = cluster.get_json("pods", "-A")["items"]
    for pod in pods:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        logs = cluster.kubectl("logs", "-n", ns, name, "--all-containers", check=False)
        (out / f"{ns}_{name}.log").write_text(logs.stdout + logs.stderr)
