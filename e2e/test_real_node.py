"""Pods really run on the real node: it registers Ready beside kwok's fake node, a pod's logs
come back through the API server, pods reach each other over the bridge, a ClusterIP Service
reaches a pod through kube-proxy from a pod and from the host, a pod calls the API server with
in-cluster config (as the operator and router will) under RBAC, and stopping leaves the host as
it was.

Needs root, Debian's containerd/runc/CNI plugins/iptables/busybox-static
(`bash e2e/tools/install-node.sh`) and the kubelet and kube-proxy (`make tools`). Without them
these tests skip, unless `CI` is set, where they fail. The control plane is this module's own
(one fake node, one real node), so the fake-node suite is untouched by it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import node_host
import node_images
import pytest
from cluster import K8S_VERSION, Cluster, bin_dir, missing_binaries
from kube import SERVICE_CIDR, condition, is_true, wait_until
from realnode import INSTALL_HINT, LABEL, NODE_NAME, RealNode, busybox_pod, missing_prerequisites

# `cluster` too: whatever leaves out the control-plane tests (`make unit`) leaves these out.
pytestmark = [pytest.mark.cluster, pytest.mark.node]

WAIT = 180.0  # generous: pods start in seconds on an idle machine, slower on a busy one


def host_leftovers(workdir: Path) -> dict[str, Any]:
    """What of the node's is still on the host (all empty once it stopped cleanly)."""
    run = str(node_host.run_dir())
    routes = node_host.sh("ip", "-4", "route", "show", "table", "all").splitlines()
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    cmdlines = []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            cmdlines.append(entry.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return {
        "bridge": [node_host.BRIDGE] if Path("/sys/class/net", node_host.BRIDGE).exists() else [],
        "routes": [r for r in routes if node_host.BRIDGE in r or SERVICE_CIDR in r],
        "chains": [
            f"{table}/{chain}"
            for table, chains in node_host.chains().items()
            for chain in chains
            if chain.startswith(node_host.OWNED_CHAINS)
        ],
        "cgroups": [str(p) for p in node_host.cgroup_tree()],
        "mounts": [p for p in points if p.startswith((run, str(workdir)))],
        "processes": [c for c in cmdlines if f"{run}/" in c or str(workdir) in c],
        "state": [str(p) for p in Path(run).glob("*") if p.name != "lock"],
    }


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = missing_binaries() + missing_prerequisites(bin_dir())
    if missing:
        message = f"real node prerequisites missing ({', '.join(missing)}): {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with Cluster(tmp_path_factory.mktemp("real-node"), nodes=1, real_node=True) as running:
        yield running


@pytest.fixture(scope="module")
def node(real_cluster: Cluster) -> RealNode:
    assert real_cluster.node is not None
    return real_cluster.node


@pytest.fixture(scope="module")
def ns(real_cluster: Cluster) -> str:
    name = f"real-node-{secrets.token_hex(3)}"
    real_cluster.kubectl("create", "namespace", name)
    return name


def running_pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = cluster.get_json("pod", name, "-n", ns)
        if pod["status"].get("phase") == "Failed":
            raise AssertionError(f"pod {name} failed: {pod['status']}")
        return pod if is_true(pod, "Ready") else None

    return wait_until(f"pod {ns}/{name} Ready", ready, timeout=WAIT, interval=0.5)


def exec_in(cluster: Cluster, ns: str, pod: str, *command: str) -> str:
    return cluster.kubectl("exec", "-n", ns, pod, "--", *command, timeout=60).stdout


def http_get(url: str) -> str:
    """From the host, bypassing any proxy the environment names: traffic stays on the machine."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as resp:
        return str(resp.read().decode())


@pytest.fixture(scope="module")
def web(real_cluster: Cluster, node: RealNode, ns: str) -> dict[str, Any]:
    """An HTTP server pod (busybox httpd answering its hostname), a client pod, a Service."""
    serve = (
        "mkdir -p /www && echo pong-$(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www"
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    pods = [
        busybox_pod(node, "web", serve, {"app": "web"}),
        busybox_pod(node, "client", "exec sleep 2147483647"),
    ]
    real_cluster.apply_objects([*pods, service], namespace=ns)
    server = running_pod(real_cluster, ns, "web")
    client = running_pod(real_cluster, ns, "client")
    cluster_ip = real_cluster.get_json("service", "web", "-n", ns)["spec"]["clusterIP"]
    return {"server": server, "client": client, "cluster_ip": cluster_ip}


def wget(cluster: Cluster, ns: str, pod: str, url: str) -> str:
    """GET from inside a pod (busybox 1.35's wget crashes with -T: `timeout` bounds it)."""
    return exec_in(cluster, ns, pod, "timeout", "10", "wget", "-qO-", url)


def test_real_node_registers_ready_beside_kwoks_fake_node(
    real_cluster: Cluster, node: RealNode
) -> None:
    real = real_cluster.get_json("node", NODE_NAME)
    assert is_true(real, "Ready")
    assert real["metadata"]["labels"][LABEL] == "true"
    info = real["status"]["nodeInfo"]
    assert info["kubeletVersion"] == K8S_VERSION  # the kubelet's, not kwok's
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert {"type": "InternalIP", "address": node.ip} in real["status"]["addresses"]
    assert ipaddress.ip_address(node.ip) in ipaddress.ip_network(node.subnet)
    # Sized from the machine, minus what is reserved for the node's daemons and the rest.
    capacity, allocatable = real["status"]["capacity"], real["status"]["allocatable"]
    assert int(capacity["cpu"]) == os.cpu_count()
    assert int(allocatable["cpu"].removesuffix("m")) < 1000 * int(capacity["cpu"])
    for pressure in ("MemoryPressure", "DiskPressure", "PIDPressure"):
        assert (condition(real, pressure) or {}).get("status") == "False", pressure
    # kwok still runs its fake node, and only that one.
    fake = real_cluster.get_json("node", "gpu-node-0")
    assert is_true(fake, "Ready")
    assert fake["status"]["nodeInfo"]["kubeletVersion"] != K8S_VERSION
    assert "kwok.x-k8s.io/node" not in real["metadata"].get("annotations", {})


def test_pod_runs_on_the_real_node_and_its_logs_are_readable(
    real_cluster: Cluster, node: RealNode, ns: str
) -> None:
    token = f"hello-from-the-real-node-{secrets.token_hex(4)}"
    # `$$$$`: Kubernetes turns `$$` into `$` in commands, so the shell sees `$$`, its own pid.
    pod = busybox_pod(
        node, "hello", f"echo {token}; echo pid $$$$ uid $(id -u); exec sleep 2147483647"
    )
    real_cluster.apply_objects([pod], namespace=ns)
    running = running_pod(real_cluster, ns, "hello")
    assert running["spec"]["nodeName"] == NODE_NAME
    assert running["status"]["hostIP"] == node.ip
    assert ipaddress.ip_address(running["status"]["podIP"]) in ipaddress.ip_network(node.subnet)
    container = running["status"]["containerStatuses"][0]
    assert container["containerID"].startswith("containerd://")  # a real container
    assert container["ready"] and "running" in container["state"]

    def both_lines() -> str | None:
        out = real_cluster.kubectl("logs", "-n", ns, "hello").stdout
        return out if token in out and " uid " in out else None

    logs = wait_until("the pod's log lines", both_lines, timeout=WAIT)
    assert re.search(r"^pid 1 uid 0$", logs, re.M), logs  # its own PID namespace
    assert exec_in(real_cluster, ns, "hello", "hostname").strip() == "hello"


def test_pods_reach_each_other_over_pod_ips(
    real_cluster: Cluster, ns: str, web: dict[str, Any]
) -> None:
    server_ip, client_ip = web["server"]["status"]["podIP"], web["client"]["status"]["podIP"]
    assert server_ip != client_ip

    def get(pod: str, url: str) -> str:
        return wait_until(f"{url} from {pod}", lambda: wget(real_cluster, ns, pod, url), WAIT)

    assert get("client", f"http://{server_ip}:8080/").strip() == "pong-web"
    # and the other way round, to a listener started in the client
    exec_in(real_cluster, ns, "client", "sh", "-c", "echo back > /tmp/i && httpd -p 9090 -h /tmp")
    assert get("web", f"http://{client_ip}:9090/i").strip() == "back"


def test_cluster_ip_service_reaches_the_pod_from_a_pod_and_from_the_host(
    real_cluster: Cluster, node: RealNode, ns: str, web: dict[str, Any]
) -> None:
    cluster_ip = web["cluster_ip"]
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network(SERVICE_CIDR)
    url = f"http://{cluster_ip}/"
    # kube-proxy writes the rules once the EndpointSlice lists the ready pod: poll, no sleeps.
    from_pod = wait_until(
        "the Service from the client pod",
        lambda: wget(real_cluster, ns, "client", url).strip(),
        timeout=WAIT,
        interval=1,
    )
    assert from_pod == "pong-web"
    assert wait_until("the Service from the host", lambda: http_get(url).strip(), timeout=WAIT) == (
        "pong-web"
    )
    env = exec_in(real_cluster, ns, "client", "env")
    assert f"WEB_SERVICE_HOST={cluster_ip}" in env  # no DNS here: Services by env or IP


@pytest.fixture(scope="module")
def kubectl_image(node: RealNode) -> str:
    """busybox + the harness's kubectl, built (cached) and imported only for the tests below."""
    image = node_images.build_kubectl(bin_dir() / "kubectl")
    node.import_images(image.archive)
    return image.name


def finished_pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = cluster.get_json("pod", name, "-n", ns)
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_until(f"pod {ns}/{name} to finish", done, timeout=WAIT, interval=0.5)


def test_kubernetes_service_leads_to_the_api_server_on_the_bridge(
    real_cluster: Cluster, node: RealNode, ns: str
) -> None:
    assert real_cluster.server == f"https://{node.ip}:{real_cluster.port}"
    default = real_cluster.get_json("endpointslice", "kubernetes", "-n", "default")
    assert [a for e in default["endpoints"] for a in e["addresses"]] == [node.ip]
    assert [p["port"] for p in default["ports"]] == [real_cluster.port]
    # The controller-manager publishes the cluster CA into each namespace.
    get = real_cluster.get_json
    ca = wait_until("kube-root-ca.crt", lambda: get("configmap", "kube-root-ca.crt", "-n", ns))
    assert ca["data"]["ca.crt"].strip() == real_cluster.ca_file.read_text().strip()


def test_pod_calls_the_api_server_with_in_cluster_config_under_rbac(
    real_cluster: Cluster, node: RealNode, ns: str, kubectl_image: str
) -> None:
    rule = {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
            "verbs": ["get", "list"]}  # fmt: skip
    rbac = "rbac.authorization.k8s.io/v1"
    objects: list[Any] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}},
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": "slices"}, "rules": [rule]},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": "reader-slices"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "slices"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "probe"},
         "spec": {"selector": {"app": "probe"}, "ports": [{"port": 80}]}},
    ]  # fmt: skip
    real_cluster.apply_objects(objects, namespace=ns)
    selector = "kubernetes.io/service-name=probe"
    args = ("get", "endpointslices", "-n", ns, "-l", selector, "-o", "name")
    slice_name = wait_until(
        "the probe Service's EndpointSlice", lambda: real_cluster.kubectl(*args).stdout.strip()
    )
    # No kubeconfig in the pod: kubectl falls back to in-cluster config (the projected token,
    # the mounted CA, KUBERNETES_SERVICE_HOST/PORT), verifying the API server's certificate.
    script = (
        "echo api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; "
        "kubectl auth whoami -o jsonpath='{.status.userInfo.username}{\"\\n\"}' && "
        f"exec kubectl -v=6 get endpointslices -l {selector} -o name"
    )
    for name in ("reader", "nobody"):
        pod = busybox_pod(node, f"kubectl-{name}", script)
        pod["spec"].update(serviceAccountName=name, restartPolicy="Never")
        pod["spec"]["containers"][0]["image"] = kubectl_image
        real_cluster.apply_objects([pod], namespace=ns)
    allowed = finished_pod(real_cluster, ns, "kubectl-reader")
    logs = real_cluster.kubectl("logs", "-n", ns, "kubectl-reader").stdout
    assert allowed["status"]["phase"] == "Succeeded", logs
    assert "api=10.96.0.1:443" in logs
    assert f"system:serviceaccount:{ns}:reader\n" in logs
    url = f"https://10.96.0.1:443/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
    assert url in logs and "200 OK" in logs, logs
    assert slice_name in logs.splitlines(), logs
    volumes = [v for v in allowed["spec"]["volumes"] if "projected" in v]
    sources = [k for v in volumes for s in v["projected"]["sources"] for k in s]
    assert "serviceAccountToken" in sources and "configMap" in sources, volumes
    # Same pod, same token path, no RoleBinding: authenticated, and refused by RBAC.
    denied = finished_pod(real_cluster, ns, "kubectl-nobody")
    logs = real_cluster.kubectl("logs", "-n", ns, "kubectl-nobody").stdout
    assert denied["status"]["phase"] == "Failed", logs
    assert f"system:serviceaccount:{ns}:nobody\n" in logs
    assert "403 Forbidden" in logs and "Error from server (Forbidden)" in logs, logs
    assert 'cannot list resource "endpointslices" in API group "discovery.k8s.io"' in logs


def test_stop_leaves_the_host_as_it_was(real_cluster: Cluster, node: RealNode) -> None:
    """Runs last: stops this module's cluster, then looks for anything of the node's."""
    assert node.state is not None
    sysctls, new_dirs = dict(node.state.sysctls), list(node.state.new_dirs)
    real_cluster.stop()
    assert host_leftovers(real_cluster.workdir) == {
        k: [] for k in ("bridge", "routes", "chains", "cgroups", "mounts", "processes", "state")
    }
    assert {n: node_host.read_sysctl(n) for n in sysctls} == sysctls  # as before the node
    assert [d for d in new_dirs if os.path.exists(d)] == []
    assert not (node.workdir / "containerd-root").exists()
