"""Small pieces of Kubernetes plumbing shared by the e2e harness, tests and benchmark.

Kept apart from `cluster.py` (process lifecycle) so tests can use them without a cluster:
loopback ports, polling with a useful timeout message, kubeconfigs, a throwaway PKI, the fake
EKS GPU node, and reading standard conditions. Standard library only.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
SERVICE_CIDR = "10.96.0.0/16"
"""The control plane's Service range, which the real node's bridge routes too."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on at `host` (loopback, or the real node's bridge address)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nobody listens on the port (TIME_WAIT leftovers don't count: servers reuse those)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_until(
    what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last error."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = probe()
            if result:
                return result
        except Exception as exc:  # probes fail while things start; report the last one
            last_error = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}: {last_error}")
        time.sleep(interval)


def fake_gpu_node(name: str, layer3: str, zone: str = "us-east-2a") -> dict[str, Any]:
    """A Node that looks like an EKS p5en.48xlarge with EFA, run by kwok."""
    capacity = {
        "cpu": "192",
        "memory": "2Ti",
        "pods": "250",
        "ephemeral-storage": "4Ti",
        "hugepages-2Mi": "64Gi",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "16",  # p5en.48xlarge: 16 EFA devices (see examples/)
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "node.kubernetes.io/instance-type": "p5en.48xlarge",
                "topology.kubernetes.io/region": "us-east-2",
                "topology.kubernetes.io/zone": zone,
                "topology.k8s.aws/network-node-layer-1": "nn-layer1-a",
                "topology.k8s.aws/network-node-layer-2": f"nn-layer2-{layer3}",
                "topology.k8s.aws/network-node-layer-3": f"nn-layer3-{layer3}",
                "eks.amazonaws.com/nodegroup": "gpu-p5en",
                "nvidia.com/gpu.present": "true",
                "vpc.amazonaws.com/efa.present": "true",
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def write_kubeconfig(
    path: Path, server: str, ca_file: Path, token: str, user: str, namespace: str = "default"
) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "boomerang-e2e",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": "boomerang-e2e",
                "context": {"cluster": "boomerang-e2e", "user": user, "namespace": namespace},
            }
        ],
        "current-context": "boomerang-e2e",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(pki: Path, ips: Sequence[str] = ()) -> None:
    """A CA, an apiserver serving cert, and the ServiceAccount signing key pair.

    The serving cert names loopback, the `kubernetes` Service's ClusterIP (what pods' in-cluster
    config dials) and `ips` (the real node's bridge address, where the API server then serves).
    """
    if (pki / "sa.pub").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = str(pki / "ca.key"), str(pki / "ca.crt")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_crt,
             "-days", "3650", "-subj", "/CN=boomerang-e2e-ca")  # fmt: skip
    addresses = ",".join(f"IP:{ip}" for ip in dict.fromkeys(["127.0.0.1", "10.96.0.1", *ips]))
    (pki / "san.ext").write_text(
        f"subjectAltName={addresses},DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki / "apiserver.key"),
             "-out", str(pki / "apiserver.csr"), "-subj", "/CN=kube-apiserver")  # fmt: skip
    _openssl("x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", ca_crt, "-CAkey", ca_key,
             "-CAcreateserial", "-out", str(pki / "apiserver.crt"), "-days", "3650",
             "-extfile", str(pki / "san.ext"))  # fmt: skip
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type `kind`, or None."""
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_true(obj: dict[str, Any], kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"
