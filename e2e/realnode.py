"""One real node beside kwok's fake ones: containerd and runc, a kubelet and kube-proxy.

kwok makes pods Running without running anything, which is enough to test the operator's
objects but proves nothing about what runs in them. This adds a node where pods really run, on
the same loopback control plane (`Cluster(real_node=True)`): Debian's containerd and runc, the
kubelet and kube-proxy built by `e2e/tools/build.sh` from the same pinned Kubernetes modules,
images made locally (`node_images.py`, no registry here), and a bridge network that the harness
creates and removes (`node_host.py`, which also records every change to the host so that
nothing leaks into the next run, even after a killed one).

What this machine needs and the kubelet is told: cgroup v1 (`failCgroupV1: false`, cgroupfs),
no swap check, no allocatable enforcement, `restrict_oom_score_adj` in containerd (root here
lacks CAP_SYS_RESOURCE), runc (crun refuses the hybrid cgroup layout), and the node addressed by
its bridge IP only, so the API server never resolves a host name. There is no cluster DNS: pods
reach each other and Services by IP (or the `*_SERVICE_HOST` environment variables).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import node_config
import node_host
import node_images
from kube import SERVICE_CIDR, free_port, is_true, wait_until, write_kubeconfig
from procs import Proc


class Cluster(Protocol):
    """What the node reads of the control plane that starts it (`cluster.Cluster`), named
    here so that this module need not import the cluster, which imports it."""

    @property
    def server(self) -> str: ...

    @property
    def ca_file(self) -> Path: ...

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]: ...

    def get_json(self, *args: str, kubeconfig: Path | None = None) -> dict[str, Any]: ...


NODE_NAME = "boomerang-real-node"
LABEL = "boomerang.dev/real-node"
INSTALL_HINT = "run `bash e2e/tools/install-node.sh` (apt) and `make tools` as root"
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip")
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback stays local


def missing_prerequisites(binaries: Path) -> list[str]:
    """What this machine lacks to run the real node (empty when it can)."""
    missing = [] if os.geteuid() == 0 else ["root"]
    missing += [b for b in ("kubelet", "kube-proxy") if not os.access(binaries / b, os.X_OK)]
    missing += [t for t in HOST_TOOLS if not shutil.which(t)]
    if node_config.cni_bin_dir() is None:
        plugins, dirs = node_config.CNI_PLUGINS, node_config.CNI_BIN_DIRS
        missing.append(f"CNI plugins {', '.join(plugins)} (in {' or '.join(dirs)})")
    if not node_images.is_static_elf(node_images.BUSYBOX):
        missing.append(f"a static busybox at {node_images.BUSYBOX} (busybox-static)")
    if not node_host.cgroup_mounts():
        missing.append("mounted cgroups")
    return missing


@dataclass
class RealNode:
    """The node's daemons and host state. `Cluster` prepares it (lock, bridge) and takes its
    tokens and API server flags before the API server starts, starts its daemons after the fake
    nodes, and stops it first."""

    workdir: Path
    binaries: Path
    logs: Path
    name: str = NODE_NAME
    run: Path = field(default_factory=node_host.run_dir)
    kubelet_token: str = field(default_factory=lambda: secrets.token_hex(16))
    proxy_token: str = field(default_factory=lambda: secrets.token_hex(16))
    state: node_host.HostState | None = None
    images: node_images.NodeImages | None = None
    procs: dict[str, Proc] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # s from prepare()/start() to steps
    kubelet_port: int = 0
    healthz_port: int = 0
    proxy_port: int = 0
    _lock: node_host.Lock | None = None

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def layout(self) -> node_config.NodeLayout:
        assert self.state is not None
        return node_config.NodeLayout(self.name, self.workdir, self.run, self._kubelet_root(),
                                      self.subnet, self.ip, self.image_store)  # fmt: skip

    @property
    def image_store(self) -> Path:
        """containerd's root (content and snapshots), kept between runs like the other caches:
        importing the connector image (4 GB) costs minutes, a label says whether it is current
        (images/containerd.py), and containers a run left behind are removed at the next
        start. One real node per machine (the lock) means one user of it at a time."""
        cache = Path(os.environ.get("BOOMERANG_CACHE") or Path.home() / ".cache" / "boomerang")
        return Path(os.environ.get("BOOMERANG_NODE_IMAGE_STORE") or cache / "node-containerd")

    @property
    def subnet(self) -> str:
        return self.state.subnet if self.state else ""

    @property
    def ip(self) -> str:
        """The node's InternalIP: its bridge's address, the pods' gateway."""
        return self.state.gateway if self.state else ""

    @property
    def busybox_image(self) -> str:
        assert self.images is not None
        return self.images.busybox

    def pids(self) -> dict[str, int]:
        return {n: p.popen.pid for n, p in self.procs.items() if p.popen and p.alive()}

    # Before the API server starts: identities ----------------------------------------------
    def token_lines(self) -> str:
        """Static tokens for tokens.csv: the kubelet as its Node (for the Node authorizer) and
        kube-proxy as `system:kube-proxy` (bound to system:node-proxier by default RBAC)."""
        node = f"system:node:{self.name}"
        return (
            f'{self.kubelet_token},{node},{node},"system:nodes"\n'
            f"{self.proxy_token},system:kube-proxy,system:kube-proxy\n"
        )

    def apiserver_flags(self, pki: Path) -> list[str]:
        """How the API server reaches the kubelet (logs, exec): by InternalIP only, with a
        client certificate in system:masters, which the kubelet checks against the cluster CA
        and authorizes through the API server (webhook)."""
        key, crt = pki / "kubelet-client.key", pki / "kubelet-client.crt"
        if not crt.exists():
            (pki / "kubelet-client.ext").write_text("extendedKeyUsage=clientAuth\n")
            csr = pki / "kubelet-client.csr"
            subject = "/O=system:masters/CN=kube-apiserver-kubelet"
            node_host.sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                         "-out", str(csr), "-subj", subject)  # fmt: skip
            node_host.sh("openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"),
                         "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-out", str(crt),
                         "-days", "3650", "-extfile", str(pki / "kubelet-client.ext"))  # fmt: skip
        return [
            f"--kubelet-client-certificate={crt}",
            f"--kubelet-client-key={key}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    # Lifecycle -------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Before the API server starts: the lock, and the host made ready (the bridge among
        it), so that the API server can serve on the bridge address, which pods reach."""
        missing = missing_prerequisites(self.binaries)
        if missing:
            raise FileNotFoundError(f"real node: missing {', '.join(missing)}: {INSTALL_HINT}")
        began = time.monotonic()
        self._lock = node_host.Lock(self.run)
        self._lock.acquire()
        try:
            self._recover()
            self._prepare_host()
            self._step("host", began)
        except BaseException:
            self.stop()
            raise

    def start(self, cluster: Cluster) -> None:
        """After the control plane: containerd, the images, the kubelet, kube-proxy."""
        if self.state is None:
            self.prepare()
        began = time.monotonic()
        try:
            self.images = node_images.build()
            self._write_configs(cluster)
            self._step("configs", began)
            self._start_containerd()
            self._remove_containers()
            self._step("containerd", began)
            self.import_images(self.images.archive)
            self._step("images", began)
            self._start_kubelet(cluster)
            self._step("kubelet Ready", began)
            self._start_kube_proxy()
            self._step("kube-proxy", began)
        except BaseException:
            self.stop(cluster)
            raise

    def stop(self, cluster: Cluster | None = None) -> None:
        """Pods deleted through the API (so CNI releases them), daemons stopped, host undone."""
        kubelet = self.procs.get("kubelet")
        if cluster is not None and kubelet is not None and kubelet.alive():
            cluster.kubectl("delete", "pods", "--all-namespaces", "--grace-period=1",
                            f"--field-selector=spec.nodeName={self.name}", "--timeout=90s",
                            "--request-timeout=20s", check=False, timeout=120)  # fmt: skip
            cluster.kubectl("delete", "node", self.name, "--wait=false", "--request-timeout=20s",
                            check=False, timeout=30)  # fmt: skip
        for name in ("kube-proxy", "kubelet"):
            if name in self.procs:
                self.procs.pop(name).stop(grace=15)
        if "containerd" in self.procs:
            self._kill_tasks()
            self.procs.pop("containerd").stop(grace=15)
        problems = node_host.teardown(self.state, str(self.socket)) if self.state else []
        self.state = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if problems:
            raise RuntimeError("real node teardown left: " + "; ".join(problems))

    # Host --------------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Undo what a previous run that died left behind (its state file says what)."""
        old = node_host.HostState.load(self.run / "state.json")
        if old is not None:
            problems = node_host.teardown(old, str(self.socket))
            if problems:
                raise RuntimeError("could not undo a previous real node: " + "; ".join(problems))
        node_host.remove_cgroups()
        node_host.delete_bridge()

    def _prepare_host(self) -> None:
        state = node_host.HostState(self.run / "state.json")
        state.chains_before = node_host.chains()
        foreign = node_host.foreign_chains(state.chains_before)
        if foreign:
            raise RuntimeError(
                f"iptables already has {', '.join(foreign[:5])}: another kubelet or kube-proxy "
                "runs on this machine, and its rules and ours would collide"
            )
        state.sysctls = {
            n: v for n in node_host.SYSCTLS if (v := node_host.read_sysctl(n)) is not None
        }
        state.new_dirs = [d for d in node_host.FIXED_DIRS if not Path(d).exists()]
        state.subnet = node_host.pick_subnet()
        kubelet_root = self._kubelet_root()
        state.mount_roots = [str(self.run), str(self.workdir), str(kubelet_root)]
        state.mount_roots.append(str(self.image_store))
        state.delete = [str(self.run / d) for d in ("containerd", "runc", "cni-ipam")]
        state.delete += [str(self.socket), f"{self.socket}.ttrpc"]
        state.delete += [str(kubelet_root)]
        state.pod_logs = str(self.workdir / "pod-logs")  # = NodeLayout.pod_logs
        state.containerd_state = str(self.run / "containerd")
        self.state = state
        state.save()  # before anything is made: a killed run is undone from this file
        node_host.make_cgroup_root()
        node_host.make_bridge(state, SERVICE_CIDR)
        node_host.add_guard(state.subnet)
        for name, value in node_host.NODE_SYSCTLS.items():
            node_host.write_sysctl(name, value)

    def _kubelet_root(self) -> Path:
        """Under the workdir, unless its sockets' paths would pass the 108-byte limit."""
        root = self.workdir / "kubelet"
        return root if len(str(root)) < 60 else self.run / "kubelet"

    # Configuration -------------------------------------------------------------------------
    def _write_configs(self, cluster: Cluster) -> None:
        assert self.state is not None and self.images is not None
        node = self.layout
        node.cni_dir.mkdir(parents=True, exist_ok=True)
        conflist = json.dumps(node_config.cni_config(node), indent=1)
        (node.cni_dir / "10-boomerang.conflist").write_text(conflist)
        containerd = node_config.containerd_config(node, self.images.pause)
        (self.workdir / "containerd.toml").write_text(containerd)
        write_kubeconfig(self.workdir / "kubelet.kubeconfig", cluster.server, cluster.ca_file,
                         self.kubelet_token, f"system:node:{self.name}")  # fmt: skip
        write_kubeconfig(self.workdir / "kube-proxy.kubeconfig", cluster.server, cluster.ca_file,
                         self.proxy_token, "system:kube-proxy")  # fmt: skip
        self.kubelet_port, self.healthz_port = free_port(), free_port()
        self.proxy_port = free_port()
        kubelet = node_config.kubelet_config(
            node, self.kubelet_port, self.healthz_port, cluster.ca_file
        )
        (self.workdir / "kubelet.json").write_text(json.dumps(kubelet, indent=1))
        proxy = node_config.proxy_config(
            node, self.workdir / "kube-proxy.kubeconfig", self.proxy_port, free_port()
        )
        (self.workdir / "kube-proxy.json").write_text(json.dumps(proxy, indent=1))

    # Daemons ---------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> Proc:
        assert self.state is not None
        self.logs.mkdir(parents=True, exist_ok=True)
        proc = Proc(name, argv, self.logs / f"{name}.log")
        proc.start()
        self.procs[name] = proc
        assert proc.popen is not None
        self.state.pids[name] = [proc.popen.pid, node_host.start_time(proc.popen.pid)]
        self.state.save()
        return proc

    def _alive(self, name: str) -> None:
        proc = self.procs[name]
        if not proc.alive():
            raise RuntimeError(f"{name} exited; last log lines:\n{proc.tail()}")

    def _ctr(self, *args: str, timeout: float = 120) -> str:
        argv = ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
        return result.stdout

    def _start_containerd(self) -> None:
        self._spawn("containerd", ["containerd", "--config", str(self.workdir / "containerd.toml")])

        def ready() -> bool:
            self._alive("containerd")
            return bool(self._ctr("version", timeout=10))

        wait_until("containerd", ready, timeout=60)

    def _start_kubelet(self, cluster: Cluster) -> None:
        root = self._kubelet_root()
        self._spawn(
            "kubelet",
            [
                str(self.binaries / "kubelet"),
                f"--config={self.workdir / 'kubelet.json'}",
                f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
                f"--root-dir={root}",
                f"--cert-dir={root / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                f"--node-labels={LABEL}=true",
                "--v=1",
            ],
        )

        def ready() -> bool:
            self._alive("kubelet")
            node = cluster.get_json("node", self.name)
            return is_true(node, "Ready")

        wait_until(f"node {self.name} Ready", ready, timeout=180, interval=0.5)

    def _start_kube_proxy(self) -> None:
        self._spawn(
            "kube-proxy",
            [str(self.binaries / "kube-proxy"), f"--config={self.workdir / 'kube-proxy.json'}"],
        )
        url = f"http://127.0.0.1:{self.proxy_port}/healthz"

        def healthy() -> bool:
            self._alive("kube-proxy")
            with NO_PROXY.open(url, timeout=5) as resp:
                return bool(resp.status == 200)

        wait_until("kube-proxy /healthz", healthy, timeout=120, interval=0.5)

    def import_images(self, archive: Path) -> None:
        """Load an OCI archive (`node_images.py`) into containerd; pods then run its images."""
        self._ctr("images", "import", str(archive))

    def _remove_containers(self) -> None:
        """What an earlier run left in the kept image store: its containers (and with them
        their snapshots, which containerd's garbage collector then frees)."""
        self._kill_tasks()
        for container in self._ctr("containers", "ls", "-q", timeout=30).split():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._ctr("tasks", "delete", "--force", container, timeout=30)
            self._ctr("containers", "delete", container, timeout=30)

    def _kill_tasks(self) -> None:
        """Containers left after the kubelet stopped: killed through containerd."""
        try:
            for task in self._ctr("tasks", "ls", "-q", timeout=20).split():
                self._ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=20)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass  # teardown kills whatever is left in the node's cgroups

    def _step(self, name: str, began: float) -> None:
        self.timings[name] = round(time.monotonic() - began, 2)


def busybox_pod(
    node: RealNode, name: str, script: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod on the real node running `script` under the local busybox image (tests, bench)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {LABEL: "true"},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": node.busybox_image,
                    "imagePullPolicy": "Never",  # built here; there is no registry to pull from
                    "command": ["sh", "-c", script],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
        },
    }
