"""High availability and namespaced installs, on the real API server with the chart's RBAC.

Leader election: two operators join the chart's peering object, as the chart's two replicas do;
only the higher priority one reconciles, and when it is SIGKILLed (a node lost, the OOM killer)
the standby takes over once the leader's heartbeat expires. A namespaced install (a second
release watching one namespace, with Roles there and no cluster-wide rights on workloads)
reconciles in its namespace with not one request denied.

The suite's own standalone operator is stopped meanwhile: it would reconcile everything.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster
from kube import wait_until
from operator_process import OperatorProcess
from suite import CHART, SERVICE_ACCOUNT, apply, example, patched, wait_ready

pytestmark = pytest.mark.cluster
PEERING = "boomerang-operator"  # the chart's default: <release>-operator
LIFETIME_S = 10  # --peering-lifetime: how long a SIGKILLed leader is waited for
RESUMED = "Resuming operations after the pause"
RECONCILED = "Handler 'reconcile_resource' succeeded"


@pytest.fixture
def alone(operator_session: OperatorProcess) -> Iterator[None]:
    """No other operator running during the test; the suite's one is back afterwards."""
    operator_session.stop()
    yield
    operator_session.start()


def _operator(
    cluster: Cluster, namespace: str, sa: str, workdir: Path, name: str, *args: str
) -> OperatorProcess:
    """An operator process as `sa` with its own log, identified in peering as `name`."""
    kubeconfig = cluster.service_account_kubeconfig(
        namespace, sa, workdir / f"{name}.kubeconfig", duration="1h"
    )
    return OperatorProcess(
        kubeconfig,
        workdir / f"{name}.log",
        # Metrics off: two operators on one host cannot share the default port.
        args=(*args, f"--peering-lifetime={LIFETIME_S}", "--metrics-port=0"),
        env={"POD_NAME": name},
    )


def _in_log(proc: OperatorProcess, text: str, timeout: float = 60) -> None:
    def found() -> bool:
        assert proc.alive(), proc.log_text()[-3000:]
        return text in proc.log_text()

    wait_until(f"{text!r} in {proc.log.name}", found, timeout=timeout, interval=0.2)


def _heartbeats(cluster: Cluster) -> dict[str, Any]:
    """The peering object's status: each live operator's priority, lifetime, last seen."""
    return dict(cluster.get_json("clusterkopfpeering", PEERING).get("status") or {})


def _joined(cluster: Cluster, identity: str) -> None:
    wait_until(f"{identity}'s heartbeat", lambda: identity in _heartbeats(cluster), timeout=30)


def test_only_the_leader_reconciles_and_its_standby_takes_over_when_it_dies(
    cluster: Cluster, chart: str, alone: None, namespace: str, tmp_path: Path
) -> None:
    peering = ("--all-namespaces", f"--peering={PEERING}")
    leader = _operator(cluster, chart, SERVICE_ACCOUNT, tmp_path, "leader", *peering,
                       "--priority=200")  # fmt: skip
    standby = _operator(cluster, chart, SERVICE_ACCOUNT, tmp_path, "standby", *peering,
                        "--priority=100")  # fmt: skip
    try:
        # In turn, so the standby's first look at the peering already sees the leader: kopf
        # starts a peering member paused, and it stays so (silently) under a higher priority.
        leader.start()
        _in_log(leader, RESUMED)
        _joined(cluster, "leader")
        standby.start()
        _joined(cluster, "standby")
        beats = _heartbeats(cluster)
        assert (beats["leader"]["priority"], beats["standby"]["priority"]) == (200, 100), beats

        manifest = example("minimal.yaml")
        apply(cluster, manifest, namespace)
        wait_ready(cluster, namespace, manifest["metadata"]["name"])
        # kopf logs a handler's success after the handler returned, so after the status it wrote
        # made the resource ready: wait for the line rather than read the log at once.
        _in_log(leader, RECONCILED, timeout=30)
        assert RECONCILED not in standby.log_text()
        assert RESUMED not in standby.log_text()

        leader.kill()
        killed = time.monotonic()
        apply(cluster, patched(manifest, "spec.decode.replicas", 2), namespace)
        dd = wait_ready(cluster, namespace, manifest["metadata"]["name"], timeout=LIFETIME_S + 60)
        took = time.monotonic() - killed
        assert dd["status"]["decode"] == {"desired": 2, "ready": 2, "updated": 2}
        assert RESUMED in standby.log_text()
        _in_log(standby, RECONCILED, timeout=30)
        print(f"standby took over and converged {took:.1f}s after the leader's SIGKILL")
    finally:
        leader.stop()
        standby.stop()


def _can_i(cluster: Cluster, user: str, verb: str, resource: str, *where: str) -> str:
    result = cluster.kubectl("auth", "can-i", verb, resource, "--as", user, *where, check=False)
    return result.stdout.strip()


def _install_namespaced(cluster: Cluster, release: str, namespace: str, watched: str) -> None:
    cluster.helm(
        "install", release, str(CHART), "--namespace", namespace, "--create-namespace",
        "--set", f"watchNamespaces={{{watched}}}", "--set", "crds.install=false",
        "--wait", "--timeout", "2m",
        timeout=180,
    )  # fmt: skip


def test_namespaced_release_reconciles_its_namespace_with_roles_alone(
    cluster: Cluster, chart: str, alone: None, namespace: str, tmp_path: Path
) -> None:
    release, home = "team", "boomerang-team"
    user = f"system:serviceaccount:{home}:{SERVICE_ACCOUNT}"
    try:
        _install_namespaced(cluster, release, home, namespace)
        assert _can_i(cluster, user, "patch", "statefulsets.apps", "-n", namespace) == "yes"
        assert _can_i(cluster, user, "patch", "statefulsets.apps", "-n", "default") == "no"
        assert _can_i(cluster, user, "list", "statefulsets.apps", "-A") == "no"
        peering = f"kopfpeerings.kopf.dev/{release}-operator"
        assert _can_i(cluster, user, "patch", peering, "-n", namespace) == "yes"
        cluster_roles: list[dict[str, Any]] = cluster.get_json(
            "clusterroles", "-l", f"app.kubernetes.io/instance={release}"
        )["items"]
        granted = {r for role in cluster_roles for rule in role["rules"] for r in rule["resources"]}
        assert granted == {"customresourcedefinitions", "namespaces"}

        proc = _operator(cluster, home, SERVICE_ACCOUNT, tmp_path, "team",
                         f"--namespace={namespace}", f"--peering={release}-operator")  # fmt: skip
        mark = cluster.audit.mark()
        proc.start()
        try:
            manifest = example("minimal.yaml")
            apply(cluster, manifest, namespace)
            wait_ready(cluster, namespace, manifest["metadata"]["name"])
            _in_log(proc, RECONCILED, timeout=30)
        finally:
            proc.stop()
        assert cluster.audit.denials(user, since=mark) == []
    finally:
        cluster.helm("uninstall", release, "-n", home, "--wait", check=False, timeout=120)
        cluster.kubectl("delete", "namespace", home, "--wait=false", check=False)
