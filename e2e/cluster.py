"""A real Kubernetes control plane on loopback, for the e2e suite and for developers.

The operator must be proven against a real kube-apiserver (with RBAC enforced, CRD validation,
CEL rules, server-side apply, garbage collection), not against mocks. There is no Docker here, so
this starts the binaries built by `e2e/tools/build.sh` directly, the way controller-runtime's
envtest does: etcd, kube-apiserver, kube-controller-manager (StatefulSet pods, garbage
collection), kube-scheduler, and kwok, which plays the kubelet for fake nodes so that pods become
Running and Ready. The fake nodes look like EKS p5en.48xlarge GPU nodes with EFA.

`Cluster(real_node=True)` adds one real node beside the fake ones (containerd, a kubelet and
kube-proxy, see `realnode.py`); kwok manages only the nodes annotated as its fake ones.

Only the standard library is used, so `python e2e/cluster.py` works before any install.
Run by hand (`make cluster`) it prints a KUBECONFIG and keeps the cluster up until Ctrl-C;
`python e2e/cluster.py --real-node` (as root) adds the real node.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import front_proxy
from audit import AuditLog, write_policy
from kube import (
    SERVICE_CIDR,
    fake_gpu_node,
    free_port,
    make_pki,
    port_free,
    wait_until,
    write_kubeconfig,
)
from procs import Proc

if TYPE_CHECKING:
    from realnode import RealNode

K8S_VERSION = "v1.36.2"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
    "kwok-stages.yaml",  # kwok's own default Stages, written by build.sh
)
# kwok plays the kubelet only for nodes carrying this annotation (`kube.fake_gpu_node` sets it),
# so that a real node's kubelet (`realnode.py`) is never contested.
KWOK_NODE_SELECTOR = "kwok.x-k8s.io/node=fake"


def bin_dir() -> Path:
    """Where build.sh caches the binaries (`BOOMERANG_K8S_BIN` overrides)."""
    override = os.environ.get("BOOMERANG_K8S_BIN")
    if override:
        return Path(override)
    cache = os.environ.get("BOOMERANG_CACHE") or str(Path.home() / ".cache" / "boomerang")
    return Path(cache) / f"k8s-{K8S_VERSION}" / "bin"


def missing_binaries(directory: Path | None = None) -> list[str]:
    directory = directory or bin_dir()
    return [name for name in BINARIES if not os.access(directory / name, os.R_OK)]

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Cluster:
    """etcd + apiserver (RBAC) + controller-manager + scheduler + kwok, all on 127.0.0.1."""

    workdir: Path
    binaries: Path = field(default_factory=bin_dir)
    nodes: int = 4
    token: str = field(default_factory=lambda: secrets.token_hex(16))  # the admin's bearer token
    port: int = 0
    etcd_port: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)
    real_node: bool = False  # also run one real node (containerd + kubelet + kube-proxy)
    node: RealNode | None = None

    # Paths -----------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def address(self) -> str:
        """Where the API server serves: loopback, or with a real node its bridge address, which
        the harness made and pods reach (the `kubernetes` Service's endpoint)."""
        return self.node.ip if self.node is not None and self.node.ip else "127.0.0.1"

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """Environment for tools run against this cluster (its binaries first on PATH)."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        env["PATH"] = f"{self.binaries}{os.pathsep}{env.get('PATH', '')}"
        if self.node is not None:  # Go proxies all but loopback: keep the bridge address local
            env["NO_PROXY"] = env["no_proxy"] = ",".join(
                filter(None, [env.get("NO_PROXY") or env.get("no_proxy"), self.address])
            )
        env["HELM_CACHE_HOME"] = str(self.workdir / "helm" / "cache")
        env["HELM_CONFIG_HOME"] = str(self.workdir / "helm" / "config")
        env["HELM_DATA_HOME"] = str(self.workdir / "helm" / "data")
        return env

    # Lifecycle -------------------------------------------------------------------------------
    def start(self) -> Cluster:
        missing = missing_binaries(self.binaries)
        if missing:
            raise FileNotFoundError(
                f"missing {', '.join(missing)} in {self.binaries}: run `make tools`"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.real_node:
            from realnode import RealNode  # imports this module: only when asked for

            self.node = RealNode(self.workdir / "node", self.binaries, self.workdir / "logs")
        try:
            if self.node is not None:
                self.node.prepare()  # its bridge first: the API server serves on its address
            self.port = self.port or free_port(self.address)
            make_pki(self.workdir / "pki", [self.address])
            tokens = f'{self.token},boomerang-admin,boomerang-admin,"system:masters"\n'
            (self.workdir / "tokens.csv").write_text(
                tokens + (self.node.token_lines() if self.node else "")
            )
            write_kubeconfig(self.kubeconfig, self.server, self.ca_file, self.token, "admin")
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            self.add_nodes(self.nodes)
            if self.node is not None:
                self.node.start(self)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every component: the real node first (its pods are deleted through the API),
        then the clients of etcd together, etcd last."""
        node, self.node = self.node, None
        try:
            if node is not None:
                node.stop(self)
        finally:
            order = ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
            procs = [self.procs.pop(name) for name in order if name in self.procs]
            for proc in procs[:-1]:
                proc.terminate()
            for proc in procs:
                proc.stop()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart_apiserver(self) -> None:
        """Stop the apiserver, wait for its port to free, start it again on the same port."""
        self.procs.pop("kube-apiserver").stop()
        wait_until("the apiserver port to free", lambda: port_free(self.port, self.address),
                   timeout=60)  # fmt: skip
        self._start_apiserver()

    # Components ------------------------------------------------------------------------------
    def _spawn(self, name: str, args: Sequence[str]) -> Proc:
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        proc = Proc(name, [str(self.binaries / name), *args], logs / f"{name}.log")
        proc.start()
        self.procs[name] = proc
        return proc

    def _check_alive(self, proc: Proc) -> None:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited; last log lines:\n{proc.tail()}")

    def _start_etcd(self) -> None:
        self.etcd_port = free_port()
        client = f"http://127.0.0.1:{self.etcd_port}"
        proc = self._spawn(
            "etcd",
            [
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--listen-peer-urls=http://127.0.0.1:{free_port()}",
                "--unsafe-no-fsync",  # throwaway data; fsync would dominate test time
            ],
        )

        def healthy() -> bool:
            self._check_alive(proc)
            with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                return bool(json.load(resp).get("health") == "true")

        wait_until("etcd health", healthy, timeout=30)

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        proc = self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                # The `kubernetes` Service cannot point at loopback: only a real node's pods
                # need it, and they reach the API server on the bridge address (its endpoint).
                f"--endpoint-reconciler-type={'lease' if self.node else 'none'}",
                "--enable-priority-and-fairness=false",
                f"--audit-policy-file={write_policy(self.workdir / 'audit-policy.json')}",
                f"--audit-log-path={self.audit.path}",
                "--audit-log-format=json",
                "--profiling=false",
                "--v=1",
                # The aggregation layer: metrics adapters (e2e/test_autoscaling.py) serve behind it.
                *front_proxy.apiserver_flags(pki),
                *(self.node.apiserver_flags(pki) if self.node else []),
            ],
        )

        def ready() -> bool:
            self._check_alive(proc)
            return self.get_raw("/readyz") == "ok"

        wait_until("kube-apiserver /readyz", ready, timeout=90)

    @property
    def audit(self) -> AuditLog:
        """What ServiceAccounts (the operator) asked of the API server, and what was denied."""
        return AuditLog(self.workdir / "logs" / "audit.jsonl")

    def _start_controllers(self) -> None:
        pki = self.workdir / "pki"
        self._spawn(
            "kube-controller-manager",
            [
                *self._component_flags(),
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--concurrent-statefulset-syncs=10",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                "--concurrent-gc-syncs=20",
                # HPAs (e2e/test_autoscaling.py) act within seconds rather than every 15s.
                "--horizontal-pod-autoscaler-sync-period=2s",
                "--profiling=false",
            ],
        )
        self._spawn("kube-scheduler", [*self._component_flags(), "--profiling=false"])
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_SELECTOR}",
                f"--config={self.binaries / 'kwok-stages.yaml'}",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{free_port()}",
                "--cidr=10.244.0.1/16",
                "--node-ip=127.0.0.1",
            ],
        )
        # Pods need the `default` ServiceAccount, which the controller-manager creates.
        wait_until(
            "the default ServiceAccount",
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            timeout=60,
        )

    def _component_flags(self) -> list[str]:
        """What the controller-manager and the scheduler share: the admin kubeconfig for the
        API, authn and authz, and a secure port of their own on loopback, no leader election."""
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
        ]

    def add_nodes(self, count: int, prefix: str = "gpu-node") -> list[str]:
        """Create `count` fake GPU nodes spread over two network layer-3 groups; wait Ready."""
        names = [f"{prefix}-{i}" for i in range(count)]
        items = [fake_gpu_node(n, layer3="a" if i % 2 == 0 else "b") for i, n in enumerate(names)]
        if items:
            self.apply_objects(items, server_side=False)
        for name in names:
            wait_until(f"node {name} Ready", lambda n=name: self._node_ready(n), timeout=60)
        return names

    def _node_ready(self, name: str) -> bool:
        node = self.get_json("node", name)
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # Clients ---------------------------------------------------------------------------------
    def request(
        self, path: str, method: str = "GET", body: Any = None, content_type: str = ""
    ) -> Any:
        """One API call as the admin over HTTPS; JSON in and out (text for non-JSON)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}"}
        if content_type:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.server + path, data, headers, method=method)
        https = urllib.request.HTTPSHandler(context=context)  # and never a proxy: all is local
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), https)
        with opener.open(request, timeout=10) as resp:
            text = resp.read().decode()
        return json.loads(text) if text.startswith("{") else text

    def get_raw(self, path: str) -> str:
        return str(self.request(path))

    def run_tool(
        self,
        tool: str,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binaries / tool), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(kubeconfig),
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
            )
        return result

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run_tool("kubectl", *args, **kwargs)

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run_tool("helm", *args, **kwargs)

    def get_json(self, *args: str, kubeconfig: Path | None = None) -> dict[str, Any]:
        out = self.kubectl("get", *args, "-o", "json", kubeconfig=kubeconfig).stdout
        return dict(json.loads(out))

    def apply_objects(
        self, objects: Sequence[dict[str, Any]], server_side: bool = True, namespace: str = ""
    ) -> None:
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        args = ["apply", "-f", "-"]
        if server_side:
            args += ["--server-side", "--field-manager=e2e", "--force-conflicts"]
        if namespace:
            args += ["-n", namespace]
        self.kubectl(*args, input=doc)

    def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path, duration: str = "24h"
    ) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount, via a TokenRequest."""
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        write_kubeconfig(path, self.server, self.ca_file, token, f"{namespace}-{name}", namespace)
        return path


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    """`make cluster`: start a cluster, print how to reach it, stop cleanly on Ctrl-C."""
    workdir = Path(tempfile.mkdtemp(prefix="boomerang-cluster-"))
    cluster = Cluster(workdir, real_node="--real-node" in sys.argv[1:])
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"starting Kubernetes {K8S_VERSION} control plane in {workdir} ...", flush=True)
    with cluster:
        print(f"\n  export KUBECONFIG={cluster.kubeconfig}")
        print(f"  export PATH={cluster.binaries}:$PATH   # kubectl, helm, kwok {K8S_VERSION}")
        if cluster.node is not None:
            print(f"  real node: {cluster.node.name} at {cluster.node.ip}, pods on "
                  f"{cluster.node.subnet}, image {cluster.node.busybox_image}")  # fmt: skip
        print(f"  logs: {workdir / 'logs'}\n\nCtrl-C stops it.", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            print("\nstopping ...", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
