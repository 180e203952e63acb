"""Preflight: a role's GPU, EFA and hugepages request against the nodes its pods may run on."""

from __future__ import annotations

from typing import Any

import pytest

from boomerang.operator.preflight import HUGEPAGES_HINT, pod_requests, shortfall

P5EN = {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def node(
    gpus: int = 8,
    efa: int = 16,
    labels: dict[str, str] | None = None,
    taints: Any = (),
    hugepages: str = "0",
    name: str = "n",
) -> dict[str, Any]:
    allocatable = {"cpu": "191450m", "nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": str(efa)}
    allocatable["hugepages-2Mi"] = hugepages
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {**P5EN, **(labels or {})}},
        "spec": {"taints": list(taints)} if taints else {},
        "status": {"capacity": allocatable, "allocatable": allocatable},
    }


def pod_spec(
    gpus: int = 8,
    efa: int = 16,
    selector: Any = None,
    tolerations: Any = (),
    hugepages: str | None = None,
    affinity: Any = None,
) -> dict[str, Any]:
    limits = {"memory": "1Ti", "nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": str(efa)}
    if hugepages is not None:
        limits["hugepages-2Mi"] = hugepages
    spec: dict[str, Any] = {"containers": [{"name": "engine", "resources": {"limits": limits}}]}
    if affinity is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": affinity}}}  # fmt: skip
    if selector is not None:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = list(tolerations)
    return spec


P5EN_NODES = [node(), node(), node()]
CASES = [
    ("fits", pod_spec(), P5EN_NODES, None),
    (
        "too much EFA",
        pod_spec(efa=32),
        P5EN_NODES,
        "decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is 16 "
        "(3 nodes match)",
    ),
    (
        "too many GPUs, one node",
        pod_spec(gpus=16),
        [node()],
        "decode needs 16 nvidia.com/gpu per pod; the most any matching node offers is 8 "
        "(1 node matches)",
    ),
    (
        "the selector narrows the nodes",
        pod_spec(efa=32, selector=P5EN),
        [node(), node(efa=32, labels={"node.kubernetes.io/instance-type": "p5.48xlarge"})],
        "decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is 16 "
        "(1 node matches)",
    ),
    ("the biggest node decides", pod_spec(efa=32), [node(), node(efa=32)], None),
    (
        "each fits somewhere but not together",
        pod_spec(gpus=8, efa=32),
        [node(gpus=8, efa=16), node(gpus=4, efa=32)],
        "decode needs 8 nvidia.com/gpu, 32 vpc.amazonaws.com/efa per pod together; no matching "
        "node offers all of them",
    ),
    ("no node matches: the scheduler says it", pod_spec(selector={"x": "y"}), P5EN_NODES, None),
    ("an untolerated taint excludes", pod_spec(efa=32), [node(taints=[GPU_TAINT])], None),
    (
        "a tolerated taint does not",
        pod_spec(efa=32, tolerations=[TOLERATE_GPU]),
        [node(taints=[GPU_TAINT])],
        "decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is 16 "
        "(1 node matches)",
    ),
    (
        "a soft taint does not exclude",
        pod_spec(efa=32),
        [node(taints=[{**GPU_TAINT, "effect": "PreferNoSchedule"}])],
        "decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is 16 "
        "(1 node matches)",
    ),
    (
        "nodes without the resource",
        pod_spec(gpus=1, efa=0),
        [node(gpus=0, efa=0)],
        "decode needs 1 nvidia.com/gpu per pod; the most any matching node offers is 0 "
        "(1 node matches)",
    ),
    ("no GPU or EFA asked for: nothing to check", pod_spec(gpus=0, efa=0), [node(0, 0)], None),
    (
        "hugepages no node reserved: what to change",
        pod_spec(hugepages="5120Mi"),
        P5EN_NODES,
        "decode needs 5120Mi hugepages-2Mi per pod; the most any matching node offers is 0Mi "
        f"(3 nodes match): {HUGEPAGES_HINT.format(role='decode')}",
    ),
    (
        "hugepages short on every node",
        pod_spec(hugepages="10Gi"),
        [node(hugepages="5Gi"), node(hugepages="8192Mi")],
        "decode needs 10240Mi hugepages-2Mi per pod; the most any matching node offers is 8192Mi "
        f"(2 nodes match): {HUGEPAGES_HINT.format(role='decode')}",
    ),
    ("hugepages reserved", pod_spec(hugepages="5120Mi"), [node(hugepages="5Gi")], None),
    (
        "hugepages only on a node without the GPUs",
        pod_spec(hugepages="5120Mi"),
        [node(hugepages="0"), node(gpus=0, efa=0, hugepages="16Gi")],
        "decode needs 8 nvidia.com/gpu, 16 vpc.amazonaws.com/efa, 5120Mi hugepages-2Mi per pod "
        "together; no matching node offers all of them",
    ),
    (
        "required node affinity narrows the nodes",
        pod_spec(
            efa=32,
            affinity=[
                {
                    "matchExpressions": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": ["p5en.48xlarge"],
                        }
                    ]
                }
            ],
        ),
        [node(), node(efa=32, labels={"node.kubernetes.io/instance-type": "p5.48xlarge"})],
        "decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is 16 "
        "(1 node matches)",
    ),
    (
        "affinity terms are alternatives; a term's requirements all hold",
        pod_spec(
            efa=32,
            affinity=[
                {
                    "matchExpressions": [
                        {"key": "pool", "operator": "Exists"},
                        {"key": "gen", "operator": "Gt", "values": ["4"]},
                    ]
                },
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["big"]}]},
            ],
        ),
        [
            node(labels={"pool": "a", "gen": "5"}),
            node(labels={"pool": "b", "gen": "4"}),
            node(efa=24, labels={"gen": "9"}),
            node(efa=32, name="other"),
        ],
        "decode needs 32 vpc.amazonaws.com/efa per pod; the most any matching node offers is 16 "
        "(1 node matches)",
    ),
    (
        "affinity matching no node: the scheduler says it",
        pod_spec(
            efa=32,
            affinity=[
                {
                    "matchExpressions": [
                        {"key": "pool", "operator": "DoesNotExist"},
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "NotIn",
                            "values": ["p5en.48xlarge"],
                        },
                    ]
                }
            ],
        ),
        P5EN_NODES,
        None,
    ),
]


@pytest.mark.parametrize(
    ("spec", "nodes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_request_no_matching_node_can_meet_is_named_with_the_numbers(
    spec: dict[str, Any], nodes: list[dict[str, Any]], expected: str | None
) -> None:
    assert shortfall("decode", spec, nodes) == expected


def test_requests_fall_back_to_limits_and_add_up_over_containers() -> None:
    spec = {
        "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "2"}}},
            {"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "9"}}},
            {"resources": {}},
        ]
    }
    assert pod_requests(spec) == {"nvidia.com/gpu": 3}


def test_hugepages_are_counted_in_bytes_whatever_the_unit() -> None:
    spec = pod_spec(gpus=0, efa=0, hugepages="5Gi")
    assert pod_requests(spec) == {"hugepages-2Mi": 5 * 2**30}
    assert pod_requests(pod_spec(gpus=0, efa=0, hugepages="5120Mi")) == pod_requests(spec)
    assert pod_requests(pod_spec(gpus=0, efa=0, hugepages="0")) == {}
