"""The product on a real node, installed as a user installs it (see node_stack.py): the operator
in a pod from `helm install`, the CPU sample's P and D running vLLM with NIXL in containers, two
router pods sharing Redis, and the official `openai` client talking to the router's Service.

The tests run in order on one installation, each leaving it serving: conversations through the
Service (streamed and not) reuse D's KV and match a single engine; D's pod deleted between turns,
then a router pod, then the operator's mid-rollout; a recompute-threshold change rolls the
engines while a client keeps talking; deleting the resource and uninstalling the chart leave
nothing behind.

Needs what test_real_node.py needs plus the images (built here by images/build.py, cached):
without them these tests skip, unless `CI` is set, where they fail.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Cluster, bin_dir, missing_binaries
from dataplane.turns import chat, chat_reference, moved, same
from images.build import Builder
from images.buildah import install_tools, missing_tools
from images.containerd import public_name
from kube import wait_until
from node_stack import IMAGES, Stack, node_logs
from realnode import INSTALL_HINT, NODE_NAME, missing_prerequisites
from suite import CHILD_KINDS, RELEASE, RELEASE_NAMESPACE, operator_user

from boomerang.operator.api import DEFAULT_ROUTER_IMAGE
from boomerang.operator.render import ROUTER_PORT

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.timeout(3600)]
CI = bool(os.environ.get("CI"))
ENGINES_START_S = 1200.0
"""P and D start together on two cores, each building its model and loading vLLM: 1-3 minutes
on an idle machine, several times that on a loaded one. A wait this long only costs time when
something is broken, and then the status and events are printed."""


def unavailable(why: str) -> None:
    if CI:
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    missing = missing_binaries() + missing_prerequisites(bin_dir())
    if missing:
        unavailable(f"real node prerequisites missing ({', '.join(missing)}): {INSTALL_HINT}")
    if install_tools() if CI else missing_tools():
        unavailable(f"image tools missing: {' '.join(missing_tools())}")
    started = time.monotonic()
    images = Builder().build(IMAGES)
    build_s = time.monotonic() - started
    workdir = tmp_path_factory.mktemp("node-stack")
    with Cluster(workdir, nodes=0, real_node=True) as cluster:
        stack = Stack(cluster, "stack", images, timings={"images (build or cache)": build_s})
        try:
            stack.import_images()
            stack.helm_install()
            cluster.kubectl("create", "namespace", stack.namespace)
            redis_url = stack.install_redis()
            started = time.monotonic()
            stack.apply_sample(redis_url)
            stack.wait_ready(ENGINES_START_S)
            stack.timings["apply -> Ready (engines start)"] = time.monotonic() - started
            stack.wait_routers_see_both(timeout=60)  # every test starts from found engines
            yield stack
        finally:
            node_logs(cluster, workdir / "pod-logs")
            print("\nnode stack timings:", {k: round(v, 1) for k, v in stack.timings.items()})


def opening(conv: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"{conv}: you answer briefly. " * 50}]


def ask(messages: list[dict[str, str]]) -> None:
    turn = sum(1 for m in messages if m["role"] == "user")
    messages.append({"role": "user", "content": f"Question {turn}: " + "tell me more " * 25})


def conversation(
    stack: Stack,
    conv: str,
    turns: int,
    *,
    stream: bool,
    messages: list[dict[str, str]] | None = None,
    url: str | None = None,
) -> list[dict[str, Any]]:
    """Turns of one chat (continuing `messages` when given) through the router's Service, or
    `url`; per turn: the reuse outcome, the tokens P pulled, and whether the answer equals P's
    own for the same messages (the single-engine reference)."""
    messages = opening(conv) if messages is None else messages
    history = []
    for _ in range(turns):
        ask(messages)
        before, pulled = stack.reuse(), stack.pulled_tokens()
        answer = chat(url or stack.router_url, stack.model, messages, stream=stream, conv=conv)
        history.append(
            {
                "outcome": moved(before, stack.reuse()),
                "pulled": stack.pulled_tokens() - pulled,
                "same": same(answer, chat_reference(stack.reference(), messages)),
            }
        )
        messages.append({"role": "assistant", "content": answer[0]})
    return history


def test_operator_runs_in_pods_with_the_charts_service_account(stack: Stack) -> None:
    pods = stack.operator_pods()
    assert len(pods) == 2  # the chart's default: two replicas, one leading
    for pod in pods:
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert pod["spec"]["serviceAccountName"] == "boomerang-operator"
        (container,) = pod["status"]["containerStatuses"]
        assert container["containerID"].startswith("containerd://") and container["ready"]
        local = stack.images["operator"].ref  # the chart's default names the published image
        assert container["image"] in (local, public_name(local))
    assert stack.operator_leader()["metadata"]["name"] in {p["metadata"]["name"] for p in pods}
    # It reconciled the sample (status Ready) with in-cluster config, as its ServiceAccount,
    # and the API server refused none of its requests.
    made = stack.cluster.audit.events(operator_user())
    assert any(e["verb"] == "patch" and "statefulsets" in str(e["objectRef"]) for e in made)
    assert stack.cluster.audit.denials(operator_user()) == []


def test_engines_run_vllm_in_containers_and_the_routers_find_them(stack: Stack) -> None:
    for role in ("prefill", "decode"):
        (pod,) = stack.ready_pods(role)
        assert pod["spec"]["nodeName"] == NODE_NAME
        (container,) = pod["status"]["containerStatuses"]
        assert container["containerID"].startswith("containerd://")
        local = stack.images["connector"].ref  # containerd reports either of its names
        assert container["image"] in (local, public_name(local))
        models = stack.cluster.kubectl(
            "exec", "-n", stack.namespace, pod["metadata"]["name"], "--",
            "python3", "-c",
            "import urllib.request; print(urllib.request.urlopen("
            "'http://127.0.0.1:8000/v1/models').read().decode())",
        ).stdout  # fmt: skip
        assert stack.model in models
    routers = stack.ready_pods("router")
    assert len(routers) == 2
    (router,) = routers[0]["status"]["containerStatuses"]
    assert router["image"] == DEFAULT_ROUTER_IMAGE  # the resource's default
    # Found through EndpointSlices, under the routers' own RBAC, and probed (the fixture waited
    # for their first probes: once, in CI, a replica had not yet counted P ready at Ready).
    for role in ("prefill", "decode"):
        assert stack.routers_see(role, 1), role
    assert stack.cluster.audit.denials(f"system:serviceaccount:{stack.namespace}:cpu-router") == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_multi_turn_chat_through_the_routers_service_reuses_and_matches(
    stack: Stack, stream: bool
) -> None:
    history = conversation(stack, f"chat-{stream}", 3, stream=stream)
    assert [h["outcome"] for h in history] == [{"miss": 1.0}, {"hit": 1.0}, {"hit": 1.0}]
    assert history[0]["pulled"] == 0
    assert all(h["pulled"] >= 500 for h in history[1:]), history  # the history came from D
    assert all(h["same"] for h in history), history


def delete_pod(stack: Stack, pod: dict[str, Any], namespace: str | None = None) -> None:
    ns = namespace or stack.namespace
    stack.cluster.kubectl("delete", "pod", "-n", ns, pod["metadata"]["name"], "--wait=false")


def test_decode_pod_deleted_between_turns(stack: Stack) -> None:
    messages = opening("d-restart")
    first = conversation(stack, "d-restart", 1, stream=False, messages=messages)
    assert first[0]["outcome"] == {"miss": 1.0}
    (old,) = stack.ready_pods("decode")
    delete_pod(stack, old)
    wait_until("the routers see D leave", lambda: stack.routers_see("decode", 0), 120, 0.5)
    # The next turn, while D is away: served (by P alone), not from D's blocks, and correct.
    during = conversation(stack, "d-restart", 1, stream=False, messages=messages)
    assert during[0]["same"] and "hit" not in during[0]["outcome"], during

    def back() -> bool:  # the StatefulSet brings D back: a new pod of the same name
        pods = stack.ready_pods("decode")
        return bool(pods) and pods[0]["metadata"]["uid"] != old["metadata"]["uid"]

    wait_until("a new decode pod Ready", back, timeout=ENGINES_START_S, interval=2.0)
    stack.wait_ready(120)
    wait_until("the routers readmit D", lambda: stack.routers_see("decode", 1), 120, 1.0)
    # A handle from before the restart is void: the turn recomputes, correctly; the next hits.
    after = conversation(stack, "d-restart", 2, stream=True, messages=messages)
    assert "hit" not in after[0]["outcome"] and after[0]["same"], after
    assert after[1]["outcome"] == {"hit": 1.0} and after[1]["same"], after


def router_ips(stack: Stack) -> set[str]:
    """The ready addresses behind the router's Service: where kube-proxy sends turns."""
    slices = stack.cluster.get_json(
        "endpointslices", "-n", stack.namespace,
        "-l", f"kubernetes.io/service-name={stack.name}-router",
    )  # fmt: skip
    return {
        address
        for piece in slices["items"]
        for ep in piece.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready")
        for address in ep["addresses"]
    }


def test_router_pod_deleted_the_other_replica_serves_the_next_turn_as_a_hit(
    stack: Stack,
) -> None:
    messages = opening("router-loss")
    first_pod = stack.ready_pods("router")[0]
    first_ip = first_pod["status"]["podIP"]
    first_url = f"http://{first_ip}:{ROUTER_PORT}"
    first = conversation(stack, "router-loss", 1, stream=False, messages=messages, url=first_url)
    assert first[0]["outcome"] == {"miss": 1.0}  # the handle it filed is in Redis
    delete_pod(stack, first_pod)
    wait_until(
        "the deleted router out of the Service",
        lambda: (ips := router_ips(stack)) and first_ip not in ips,
        timeout=120,
        interval=0.5,
    )
    second = conversation(stack, "router-loss", 2, stream=True, messages=messages)
    assert [t["outcome"] for t in second] == [{"hit": 1.0}, {"hit": 1.0}], second
    assert all(t["same"] for t in second), second
    wait_until("two routers again", lambda: len(stack.ready_pods("router")) == 2, 300, 1.0)


Turn = tuple[list[dict[str, str]], tuple[str, list[float]] | None, str]


class Talker(threading.Thread):
    """A client that keeps talking through the router's Service until stopped; it records each
    turn: the messages it sent, the answer (None when it failed) and the error."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.stack, self.url = stack, stack.router_url
        self.stop = threading.Event()
        self.turns: list[Turn] = []

    def run(self) -> None:
        conv = 0
        while not self.stop.is_set():
            name, messages = f"talker-{conv}", opening(f"talker-{conv}")
            for _ in range(5):  # a fresh conversation every five turns keeps prompts short
                if self.stop.is_set():
                    break
                ask(messages)
                try:
                    answer = chat(self.url, self.stack.model, messages, stream=True, conv=name)
                except Exception as exc:  # recorded: the test fails on it
                    self.turns.append((list(messages), None, repr(exc)))
                    break
                self.turns.append((list(messages), answer, ""))
                messages.append({"role": "assistant", "content": answer[0]})
            conv += 1


def test_threshold_change_rolls_the_engines_while_a_client_keeps_talking(stack: Stack) -> None:
    """And the leading operator's pod is deleted mid-rollout: the standby replica takes over and
    finishes the staged rollout (prefill first, then decode) without duplicating a child."""
    before = {role: stack.ready_pods(role)[0] for role in ("prefill", "decode")}
    kinds = ",".join(CHILD_KINDS)

    def child_names() -> list[tuple[str, str]]:
        items = stack.cluster.get_json(kinds, "-n", stack.namespace)["items"]
        return sorted((o["kind"], o["metadata"]["name"]) for o in items)

    children = child_names()
    talker = Talker(stack)
    talker.start()
    try:
        wait_until("the client's first turns", lambda: len(talker.turns) >= 2, 300, 0.5)
        manifest = stack.manifest
        manifest["spec"]["kvTransfer"] = {
            **manifest["spec"].get("kvTransfer", {}),
            "recomputeThreshold": 32,
        }
        stack.apply(manifest)
        wait_until("prefill rolling", lambda: not stack.ready_pods("prefill"), 300, 0.5)
        operator = stack.operator_leader()  # mid-rollout: decode is held for prefill by now
        delete_pod(stack, operator, RELEASE_NAMESPACE)
        stack.wait_ready(2 * ENGINES_START_S)
        stack.wait_routers_see_both(timeout=120, interval=1.0)  # both roles back in the routers
        served = len(talker.turns)
        wait_until("turns after the rollout", lambda: len(talker.turns) > served + 1, 300, 0.5)
    finally:
        talker.stop.set()
        talker.join(timeout=600)
    failed = [t for t in talker.turns if t[1] is None]
    assert not failed, failed
    assert stack.operator_leader()["metadata"]["uid"] != operator["metadata"]["uid"]
    for role, old in before.items():
        (pod,) = stack.ready_pods(role)
        assert pod["metadata"]["uid"] != old["metadata"]["uid"]
        args = " ".join(pod["spec"]["containers"][0]["args"])
        assert '"kv_recompute_threshold":32' in args, args
    assert child_names() == children  # none duplicated, none lost
    # Every answer the client got during the rollout is P's own answer to the same messages.
    reference = stack.reference()
    wrong = [t for t in talker.turns if not same(t[1], chat_reference(reference, t[0]))]
    assert not wrong, wrong
    print(f"\nthe client's turns during the rollout: {len(talker.turns)}, none failed")


def test_deleting_the_resource_and_uninstalling_leave_nothing_behind(stack: Stack) -> None:
    cluster, ns = stack.cluster, stack.namespace
    cluster.kubectl(
        "delete", "disaggregateddeployments.boomerang.dev", stack.name, "-n", ns,
        "--wait", "--timeout=300s", timeout=320,
    )  # fmt: skip
    label = f"boomerang.dev/deployment={stack.name}"

    def nothing_left() -> bool:
        return not cluster.get_json(f"pods,{','.join(CHILD_KINDS)}", "-n", ns, "-l", label)["items"]

    wait_until("every child and pod gone", nothing_left, timeout=300, interval=1.0)
    cluster.helm(
        "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", "--timeout", "3m",
        timeout=200,
    )  # fmt: skip
    wait_until(
        "the operator's pod gone",
        lambda: not cluster.get_json("pods", "-n", RELEASE_NAMESPACE)["items"],
        timeout=180,
        interval=1.0,
    )
    release = cluster.get_json(
        "all,serviceaccounts,roles,rolebindings,configmaps,secrets", "-n", RELEASE_NAMESPACE,
        "-l", "app.kubernetes.io/name=boomerang",
    )["items"]  # fmt: skip
    assert not release, [o["metadata"]["name"] for o in release]
    bindings = cluster.get_json("clusterroles,clusterrolebindings")["items"]
    assert not [o["metadata"]["name"] for o in bindings if "boomerang" in o["metadata"]["name"]]
    # The CRD stays, by design (helm.sh/resource-policy: keep): deleting it would delete every
    # user's resources, so `kubectl delete crd` is left to the user.
    crd = cluster.get_json("crd", "disaggregateddeployments.boomerang.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # What still runs on the node is Redis alone, which the user applied and removes.
    running = cluster.get_json("pods", "-A", "--field-selector", f"spec.nodeName={NODE_NAME}")
    names = [p["metadata"]["name"] for p in running["items"]]
    assert [n for n in names if not n.startswith("boomerang-redis")] == [], names
