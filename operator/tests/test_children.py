"""Child builders: golden output per sample, real Kubernetes schemas, and the behaviours
users rely on (EFA, roll on change, coherent P/D rollout, escape hatch, isolation)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from dd_testing import EXAMPLES, deployment

from boomerang.operator import render
from boomerang.operator.children import CHILD_KINDS, desired_children

GOLDEN = Path(__file__).parent / "golden"
K8S_VERSION = "1.36.0"
UID = "0b1e4f9a-0000-4000-8000-000000000001"


def _children(name: str = "minimal", patch: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return desired_children(deployment(name, patch, uid=UID))


def _find(objs: list[dict[str, Any]], kind: str, name_suffix: str) -> dict[str, Any]:
    return next(
        o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)
    )


def _engine(objs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    sts = _find(objs, "StatefulSet", f"-{role}")
    container: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_children_match_golden(path: Path) -> None:
    rendered = yaml.safe_dump_all(_children(path.stem), sort_keys=True)
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("BOOMERANG_UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert golden.read_text() == rendered, (
        f"{golden.name} differs: review, then BOOMERANG_UPDATE_GOLDEN=1 pytest {__file__}"
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_child_validates_against_kubernetes_schemas(path: Path) -> None:
    for obj in _children(path.stem):
        kubernetes_validate.validate(json.loads(json.dumps(obj)), K8S_VERSION, strict=True)


def test_the_child_kinds_table_lists_exactly_the_kinds_the_builders_make() -> None:
    """The table the API client's paths, the drift watches and the chart's RBAC read."""
    built = {(o["apiVersion"], o["kind"]) for path in EXAMPLES for o in _children(path.stem)}
    assert built == {(k.api_version, k.kind) for k in CHILD_KINDS}


def test_every_child_is_owned_and_labelled() -> None:
    for obj in _children():
        meta = obj["metadata"]
        assert meta["ownerReferences"][0]["uid"] == UID
        assert meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/managed-by"] == render.MANAGER
        assert meta["labels"][render.LABEL_DEPLOYMENT] == "minimal"


def test_efa_sets_libfabric_ipc_lock_devices_and_hugepages() -> None:
    objs = _children("qwen3-32b-p5en-efa")
    for role in ("prefill", "decode"):
        engine = _engine(objs, role)
        env = _env(engine)
        assert env["FI_PROVIDER"] == "efa"
        assert env["FI_EFA_ENABLE_SHM_TRANSFER"] == "0"
        kv = json.loads(engine["args"][engine["args"].index("--kv-transfer-config") + 1])
        assert kv["kv_connector_extra_config"]["backends"] == ["LIBFABRIC"]
        assert engine["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        limits = engine["resources"]["limits"]
        assert limits["vpc.amazonaws.com/efa"] == 16  # p5en.48xlarge
        assert limits["nvidia.com/gpu"] == 8
        assert limits["hugepages-2Mi"] == "8192Mi"  # 128 rails x 64 MiB (the example's comment)
        assert "--tensor-parallel-size" in engine["args"]


def test_efa_privileged_makes_both_roles_engine_containers_privileged() -> None:
    objs = _children("qwen3-32b-p5en-efa", {"efa": {"privileged": True}})
    for role in ("prefill", "decode"):
        context = _engine(objs, role)["securityContext"]
        assert context == {"capabilities": {"add": ["IPC_LOCK"]}, "privileged": True}
    # Without EFA the knob changes nothing: no pod needs the NIC's privileges.
    plain = _children("minimal", {"efa": {"privileged": True}})
    assert all("securityContext" not in _engine(plain, r) for r in ("prefill", "decode"))


def test_an_engine_failure_reaches_status_through_its_termination_message() -> None:
    for role in ("prefill", "decode"):
        engine = _engine(_children(), role)
        assert engine["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert "FI_EFA_ENABLE_SHM_TRANSFER" not in _env(engine)  # no EFA: no libfabric env


def test_side_channel_host_comes_from_the_pod_ip_and_ports_differ() -> None:
    objs = _children()
    p, d = _engine(objs, "prefill"), _engine(objs, "decode")
    assert _env(p)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert _env(p)["VLLM_NIXL_SIDE_CHANNEL_PORT"] != _env(d)["VLLM_NIXL_SIDE_CHANNEL_PORT"]


def test_kv_config_carries_ttl_threshold_and_roles() -> None:
    objs = _children(
        "minimal", {"kvTransfer": {"recomputeThreshold": 128, "decoderBlocksTTL": "10m"}}
    )
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        args = _engine(objs, role)["args"]
        kv = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert kv["kv_role"] == kv_role
        assert kv["kv_load_failure_policy"] == "recompute"
        extra = kv["kv_connector_extra_config"]
        assert extra["bidirectional_kv_xfer"] is True
        assert extra["kv_recompute_threshold"] == 128
        assert extra["decoder_kv_blocks_ttl"] == 600


def _template_annotations(objs: list[dict[str, Any]], role: str) -> dict[str, str]:
    kind = "Deployment" if role == "router" else "StatefulSet"
    annotations: dict[str, str] = _find(objs, kind, f"-{role}")["spec"]["template"]["metadata"][
        "annotations"
    ]
    return annotations


def test_a_ttl_change_rolls_engines_and_router_via_the_config_hash() -> None:
    before, after = _children(), _children("minimal", {"kvTransfer": {"decoderBlocksTTL": "600s"}})
    for role in ("prefill", "decode", "router"):
        old = _template_annotations(before, role)[render.ANNOTATION_CONFIG_HASH]
        assert _template_annotations(after, role)[render.ANNOTATION_CONFIG_HASH] != old, role


def test_an_image_change_rolls_both_roles_with_one_engine_revision() -> None:
    before, after = (
        _children(),
        _children("minimal", {"engine": {"image": "boomerang/connector:0.2.0"}}),
    )
    revisions = set()
    for role in ("prefill", "decode"):
        old = _template_annotations(before, role)[render.ANNOTATION_ENGINE_REVISION]
        new = _template_annotations(after, role)[render.ANNOTATION_ENGINE_REVISION]
        assert old != new
        revisions.add(new)
    assert len(revisions) == 1


def test_scaling_one_role_does_not_roll_the_other() -> None:
    before, after = _children(), _children("minimal", {"decode": {"replicas": 3}})
    assert _find(after, "StatefulSet", "-decode")["spec"]["replicas"] == 3
    assert _find(before, "StatefulSet", "-prefill") == _find(after, "StatefulSet", "-prefill")
    assert _template_annotations(before, "decode") == _template_annotations(after, "decode")


def _strategy(objs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    strategy: dict[str, Any] = _find(objs, "StatefulSet", f"-{role}")["spec"]["updateStrategy"]
    return strategy


def test_a_held_decode_gets_its_new_template_with_every_pod_partitioned_off() -> None:
    dd = deployment("minimal", {"decode": {"replicas": 3}}, uid=UID)
    released, held = desired_children(dd), desired_children(dd, decode_held=True)
    assert _strategy(held, "decode") == {"type": "RollingUpdate", "rollingUpdate": {"partition": 3}}
    assert _strategy(released, "decode")["rollingUpdate"] == {"partition": 0}
    # Held or not, decode is applied with the desired template; only the partition differs.
    decode = _find(held, "StatefulSet", "-decode")
    assert (
        decode["spec"]["template"] == _find(released, "StatefulSet", "-decode")["spec"]["template"]
    )
    # Prefill is never held, and always says so: an omitted partition would not be idempotent.
    assert _find(held, "StatefulSet", "-prefill") == _find(released, "StatefulSet", "-prefill")
    assert _strategy(held, "prefill")["rollingUpdate"] == {"partition": 0}
    kubernetes_validate.validate(json.loads(json.dumps(decode)), K8S_VERSION, strict=True)


def test_pod_template_override_merges_containers_by_name() -> None:
    patch = {
        "decode": {
            "podTemplate": {
                "spec": {
                    "priorityClassName": "inference",
                    "containers": [{"name": "engine", "env": [{"name": "EXTRA", "value": "1"}]}],
                }
            }
        }
    }
    objs = _children("minimal", patch)
    sts = _find(objs, "StatefulSet", "-decode")
    assert sts["spec"]["template"]["spec"]["priorityClassName"] == "inference"
    env = _env(_engine(objs, "decode"))
    assert env["EXTRA"] == "1" and "VLLM_NIXL_SIDE_CHANNEL_PORT" in env


def test_placement_keeps_p_and_d_in_one_topology_domain() -> None:
    objs = _children("qwen3-32b-p5en-efa")
    sts = _find(objs, "StatefulSet", "-decode")
    terms = sts["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    term = terms["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "topology.k8s.aws/network-node-layer-3"
    assert term["labelSelector"]["matchLabels"][render.LABEL_ROLE] == "prefill"


def test_router_config_discovers_both_roles_and_keeps_ttl_below_decoder() -> None:
    objs = _children("qwen3-32b-p5en-efa")
    config = yaml.safe_load(_find(objs, "ConfigMap", "-router")["data"]["router.yaml"])
    assert config["prefill"]["kubernetes"]["service"] == "qwen3-32b-prefill"
    assert config["decode"]["kubernetes"]["service"] == "qwen3-32b-decode"
    assert config["handle_ttl_s"] < config["decoder_blocks_ttl_s"] - 5
    assert config["store"]["kind"] == "redis"
    router = _find(objs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]
    assert _env(router)["BOOMERANG_REDIS_URL"] == {
        "secretKeyRef": {"name": "boomerang-redis", "key": "url"}
    }


def test_router_knows_the_prefill_recompute_threshold() -> None:
    """The router offers a partial reuse only when P would not recompute it anyway."""
    objs = _children(patch={"kvTransfer": {"recomputeThreshold": 256}})
    config = yaml.safe_load(_find(objs, "ConfigMap", "-router")["data"]["router.yaml"])
    assert config["recompute_threshold"] == 256
    args = _engine(objs, "prefill")["args"]
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_extra_config"]["kv_recompute_threshold"] == 256


def test_router_can_only_read_endpointslices() -> None:
    role = _find(_children(), "Role", "-router")
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["get", "list", "watch"]}
    ]  # fmt: skip


def test_engines_accept_traffic_only_from_their_own_deployment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BOOMERANG_PROMETHEUS_NAMESPACE", raising=False)
    policy = _find(_children(), "NetworkPolicy", "-engines")
    assert len(policy["spec"]["ingress"]) == 1
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    peers = policy["spec"]["ingress"][0]["from"]
    assert peers == [{"podSelector": {"matchLabels": {render.LABEL_DEPLOYMENT: "minimal"}}}]


def test_each_role_and_the_router_has_a_disruption_budget() -> None:
    pdbs = [o for o in _children() if o["kind"] == "PodDisruptionBudget"]
    assert sorted(p["metadata"]["name"] for p in pdbs) == [
        "minimal-decode", "minimal-prefill", "minimal-router"
    ]  # fmt: skip


def test_model_downloads_land_in_the_cache_volume() -> None:
    for role in ("prefill", "decode"):
        container = _engine(_children(), role)
        env = _env(container)
        mount = next(m for m in container["volumeMounts"] if m["name"] == "cache")
        assert env["HF_HOME"].startswith(mount["mountPath"] + "/")
        assert env["BOOMERANG_CACHE"] == mount["mountPath"]


def test_a_sized_node_local_cache_requests_its_ephemeral_storage() -> None:
    objs = _children(patch={"model": {"cache": {"size": "200Gi"}}})
    sts = _find(objs, "StatefulSet", "-decode")
    volume = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "cache")
    assert volume["emptyDir"] == {"sizeLimit": "200Gi"}
    resources = _engine(objs, "decode")["resources"]
    assert resources["requests"]["ephemeral-storage"] == "200Gi"
    assert "volumeClaimTemplates" not in sts["spec"]


def test_a_persistent_cache_is_one_claim_per_pod_kept_across_restarts() -> None:
    patch = {"model": {"cache": {"size": "500Gi", "persistent": True, "storageClassName": "gp3"}}}
    objs = _children(patch=patch)
    for role in ("prefill", "decode"):
        sts = _find(objs, "StatefulSet", f"-{role}")
        (claim,) = sts["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "cache"
        assert claim["spec"]["resources"]["requests"]["storage"] == "500Gi"
        assert claim["spec"]["storageClassName"] == "gp3"
        names = {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
        assert "cache" not in names  # the claim provides it
        assert "ephemeral-storage" not in _engine(objs, role)["resources"].get("requests", {})


def test_engines_get_a_token_only_with_a_service_account_of_their_own() -> None:
    default = _find(_children(), "StatefulSet", "-prefill")["spec"]["template"]["spec"]
    assert default["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in default
    assert default["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    objs = _children(patch={"prefill": {"serviceAccountName": "model-reader"}})
    prefill = _find(objs, "StatefulSet", "-prefill")["spec"]["template"]["spec"]
    decode = _find(objs, "StatefulSet", "-decode")["spec"]["template"]["spec"]
    assert prefill["serviceAccountName"] == "model-reader"
    assert prefill["automountServiceAccountToken"] is True
    assert decode["automountServiceAccountToken"] is False


def test_router_pods_take_their_own_placement_and_template() -> None:
    patch = {
        "router": {
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "podTemplate": {"metadata": {"annotations": {"team": "serving"}}},
        }
    }
    deployment_ = _find(_children(patch=patch), "Deployment", "-router")
    template = deployment_["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert template["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert template["metadata"]["annotations"]["team"] == "serving"
    assert render.ANNOTATION_CONFIG_HASH in template["metadata"]["annotations"]


def test_router_service_carries_annotations_and_source_ranges() -> None:
    internal = {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}
    patch = {
        "router": {
            "service": {
                "type": "LoadBalancer",
                "annotations": internal,
                "loadBalancerSourceRanges": ["10.0.0.0/8"],
            }
        }
    }
    service = _find(_children(patch=patch), "Service", "-router")
    assert service["metadata"]["annotations"] == internal
    assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]


@pytest.mark.parametrize(
    ("router", "affinity"),
    [
        ({}, "ClientIP"),  # the defaults: two replicas, the memory store
        ({"replicas": 3, "store": {"type": "memory"}}, "ClientIP"),
        ({"replicas": 1}, None),
        ({"store": {"type": "redis", "url": "redis://r:6379/0"}}, None),
    ],
    ids=["defaults", "three-on-memory", "one-replica", "redis"],
)
def test_client_ip_affinity_only_for_several_routers_on_the_memory_store(router, affinity) -> None:
    service = _find(_children(patch={"router": router}), "Service", "-router")
    assert service["spec"].get("sessionAffinity") == affinity


@pytest.mark.parametrize(
    "router",
    [
        {"service": {"type": "LoadBalancer", "allowUnauthenticated": True}},
        {"service": {"type": "LoadBalancer"}, "apiKeySecretRef": {"name": "k", "key": "keys"}},
        {
            "service": {
                "type": "LoadBalancer",
                "annotations": {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"},
            }
        },
    ],
    ids=["explicitly-open", "with-api-keys", "internal"],
)
def test_a_load_balancer_is_admitted_when_keyed_internal_or_explicitly_open(router) -> None:
    assert _find(_children(patch={"router": router}), "Service", "-router")["spec"]["type"] == (
        "LoadBalancer"
    )


def test_engines_admit_the_prometheus_namespace_to_their_http_port_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from boomerang.operator.policy import PROMETHEUS_NAMESPACE_ENV

    monkeypatch.setenv(PROMETHEUS_NAMESPACE_ENV, "monitoring")
    policy = _find(_children(), "NetworkPolicy", "-engines")
    own, scrapers = policy["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {render.LABEL_DEPLOYMENT: "minimal"}}}]}
    assert scrapers == {
        "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
        "ports": [{"protocol": "TCP", "port": 8000}],
    }
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    monkeypatch.setenv(PROMETHEUS_NAMESPACE_ENV, "")
    assert len(_find(_children(), "NetworkPolicy", "-engines")["spec"]["ingress"]) == 1
