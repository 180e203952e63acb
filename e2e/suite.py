"""What the operator's e2e tests share: the chart install, samples, and waiting on status.

Tests speak to the cluster only through kubectl and helm (the tools users have), so what
passes here passes for a user. Waiting is always on the resource's own status (Ready with
`observedGeneration` equal to `metadata.generation`), never on a fixed sleep.
"""

from __future__ import annotations

import copy
import json
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from cluster import Cluster
from kube import is_true, wait_until

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "boomerang"
EXAMPLES = ROOT / "examples"
RELEASE = "boomerang"
RELEASE_NAMESPACE = "boomerang-system"
SERVICE_ACCOUNT = "boomerang-operator"
DD = "disaggregateddeployments.boomerang.dev"
LABEL_DEPLOYMENT = "boomerang.dev/deployment"
CEL_ERRORS = ("evaluating rule", "no such key", "no such overload", "internal error")
"""What the API server writes when a CEL rule fails to evaluate instead of deciding (followed
by the rule's message, so a test must look for these, not only for the message)."""
CHILD_KINDS = (
    "statefulsets.apps",
    "deployments.apps",
    "services",
    "configmaps",
    "serviceaccounts",
    "roles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    "poddisruptionbudgets.policy",
    "networkpolicies.networking.k8s.io",
)


def operator_user() -> str:
    """The username the API server sees for the operator's ServiceAccount token."""
    return f"system:serviceaccount:{RELEASE_NAMESPACE}:{SERVICE_ACCOUNT}"


def install_chart(cluster: Cluster, chart: Path, release: str, namespace: str) -> str:
    """`helm install` the chart and wait for its workloads; returns helm's output."""
    return cluster.helm(
        "install",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--create-namespace",
        "--wait",
        "--timeout",
        "3m",
        timeout=240,
    ).stdout


def example(name: str) -> dict[str, Any]:
    """A sample from examples/, without its namespace (tests apply it into their own)."""
    obj = yaml.safe_load((EXAMPLES / name).read_text())
    obj["metadata"].pop("namespace", None)
    return dict(obj)


def examples() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def apply(cluster: Cluster, obj: dict[str, Any], namespace: str) -> None:
    """Server-side apply, as GitOps tools do."""
    cluster.apply_objects([obj], server_side=True, namespace=namespace)


def get_dd(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get_json(DD, name, "-n", namespace)


def converged(obj: dict[str, Any]) -> bool:
    """Ready for the current generation (not a stale Ready from before a spec change)."""
    status = obj.get("status") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return current and is_true(obj, "Ready")


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj = get_dd(cluster, namespace, name)
        return obj if converged(obj) else None

    try:
        return wait_until(f"{namespace}/{name} Ready", probe, timeout=timeout, interval=0.3)
    except TimeoutError as exc:
        status = get_dd(cluster, namespace, name).get("status")
        raise TimeoutError(f"{exc}\nlast status: {json.dumps(status, indent=1)}") from None


def children(cluster: Cluster, namespace: str, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Every object labelled as part of deployment `name`, keyed by (kind, name)."""
    out = cluster.get_json(
        ",".join(CHILD_KINDS), "-n", namespace, "-l", f"{LABEL_DEPLOYMENT}={name}"
    )
    return {(o["kind"], o["metadata"]["name"]): o for o in out["items"]}


def pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    out = cluster.get_json("pods", "-n", namespace, "-l", f"{LABEL_DEPLOYMENT}={name}")
    return list(out["items"])


def patched(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `obj` with the dotted `path` (e.g. spec.decode.replicas) set to `value`."""
    new = copy.deepcopy(obj)
    *parents, leaf = path.split(".")
    node = new
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return new


class StatusWatch:
    """Records every version of one resource via `kubectl get --watch`, to see transitions.

    Entering waits for the first version (the object as it stands): kubectl watches from that
    version's resourceVersion, so every change made inside the `with` block is then recorded.
    Without that wait a fast change (kwok pods go Ready in well under a second) can finish
    before kubectl has even listed the object, and its transitions are never seen.
    """

    START_TIMEOUT_S = 30.0

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.versions: list[dict[str, Any]] = []
        self._first = threading.Event()
        self._proc = subprocess.Popen(
            [str(cluster.binaries / "kubectl"), "get", DD, name, "-n", namespace,
             "--watch", "-o", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=cluster.env(),
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self._proc.stdout:
            buffer = (buffer + line).lstrip()
            while buffer:
                try:
                    obj, end = decoder.raw_decode(buffer)
                except json.JSONDecodeError:
                    break
                self.versions.append(obj)
                self._first.set()
                buffer = buffer[end:].lstrip()

    def stop(self) -> list[dict[str, Any]]:
        self._proc.terminate()
        self._proc.wait(10)
        self._thread.join(5)
        return self.versions

    def __enter__(self) -> StatusWatch:
        if not self._first.wait(self.START_TIMEOUT_S):
            self.stop()
            raise TimeoutError(f"kubectl --watch printed nothing in {self.START_TIMEOUT_S:.0f}s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def nodes_cordoned(cluster: Cluster) -> Iterator[None]:
    """Cordon every node for the block: pods created meanwhile stay Pending, so a change's
    rollout (or a loss of pods) is still visible when a test looks."""
    nodes = cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
    cluster.kubectl("cordon", *nodes)
    try:
        yield
    finally:
        cluster.kubectl("uncordon", *nodes)
