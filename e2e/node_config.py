"""What the real node's daemons are told: containerd, the CNI bridge, the kubelet, kube-proxy.

Kept apart from `realnode.py` (which starts and stops them) because each setting here answers
something about this machine or the harness, and that is easier to read as plain data:
cgroup v1 with the cgroupfs driver, root without CAP_SYS_RESOURCE, no registry, no DNS, pods on
a bridge the harness made, and nothing of the node allowed to touch machine-wide state that the
harness does not record and undo (`node_host.py`). Standard library only.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import node_host

CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
# Sized for the 2-core, 24 GiB development machine, which also runs the control plane, the
# operator and the tests (e2e/README.md has the node's measured idle cost): what is left for
# pods is 1.5 CPUs and about 21 GiB.
KUBE_RESERVED = {"cpu": "200m", "memory": "512Mi"}
SYSTEM_RESERVED = {"cpu": "300m", "memory": "2Gi"}


def cni_bin_dir() -> Path | None:
    """Debian's containernetworking-plugins, or `BOOMERANG_CNI_BIN`."""
    override = os.environ.get("BOOMERANG_CNI_BIN")
    for directory in [override] if override else CNI_BIN_DIRS:
        if all(os.access(Path(directory) / p, os.X_OK) for p in CNI_PLUGINS):
            return Path(directory)
    return None


@dataclass(frozen=True)
class NodeLayout:
    """Where everything of one real node lives, and how it is addressed."""

    name: str
    workdir: Path  # configs, pod logs
    run: Path  # the fixed per-machine directory: sockets and runtime state
    kubelet_root: Path
    subnet: str
    ip: str  # the node's InternalIP: the bridge's address, the pods' gateway
    containerd_root: Path  # containerd's images and snapshots, kept between runs (a cache)

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def cni_dir(self) -> Path:
        return self.workdir / "cni"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"


def cni_config(node: NodeLayout) -> dict[str, Any]:
    """A bridge on the harness's own bridge and subnet; no masquerade (nothing leaves)."""
    ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": node.subnet, "gateway": node.ip}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": str(node.run / "cni-ipam"),
    }
    bridge = {"type": "bridge", "bridge": node_host.BRIDGE, "isGateway": True,
              "ipMasq": False, "hairpinMode": True, "ipam": ipam}  # fmt: skip
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}}
    return {"cniVersion": "0.4.0", "name": node_host.CNI_NETWORK, "plugins": [bridge, portmap]}


def containerd_config(node: NodeLayout, sandbox_image: str) -> str:
    """containerd 1.6's CRI with its own root, state and socket; runc with cgroupfs."""
    root = node.containerd_root
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}"
state = "{node.run / "containerd"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{node.socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
[{cri}]
  sandbox_image = "{sandbox_image}"
  # Root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj (the sandbox's -998) is refused.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.cni]
    bin_dir = "{cni_bin_dir()}"
    conf_dir = "{node.cni_dir}"
    max_conf_num = 1
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{shutil.which("runc")}"
        Root = "{node.run / "runc"}"
        SystemdCgroup = false
"""


def kubelet_config(node: NodeLayout, port: int, healthz_port: int, ca_file: Path) -> Any:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # since 1.35 the kubelet refuses a cgroup v1 host by default
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node_host.CGROUP,  # pods below /boomerang-node, never the host's /kubepods
        "failSwapOn": False,
        "enforceNodeAllocatable": [],
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "address": node.ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        # The API server comes with a client certificate (system:masters) for logs and exec;
        # everything else is authorized by asking the API server.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(node.pod_logs),
        "resolvConf": "",  # no cluster DNS, and never the machine's resolver in pods
        "clusterDNS": [],
        "oomScoreAdj": 0,  # -999 (the default) needs CAP_SYS_RESOURCE
        "maxPods": 32,
        "kubeReserved": KUBE_RESERVED,
        "systemReserved": SYSTEM_RESERVED,
        "evictionHard": {
            "memory.available": "256Mi",
            "nodefs.available": "1Gi",
            "imagefs.available": "1Gi",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,  # never collect the locally built images
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "rotateCertificates": False,
    }


def proxy_config(node: NodeLayout, kubeconfig: Path, healthz_port: int, metrics_port: int) -> Any:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node.name,
        "mode": "iptables",
        "clusterCIDR": node.subnet,
        "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [f"{node.ip}/32"],  # NodePorts only on the bridge
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "oomScoreAdj": 0,
        # Leave the machine's sysctls alone: no route_localnet, no conntrack resizing.
        "iptables": {"localhostNodePorts": False, "minSyncPeriod": "1s"},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
