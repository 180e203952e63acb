"""Pure builders for the engine roles: one StatefulSet and one headless Service per role.

Why a StatefulSet: every engine pod needs a stable identity the router can name in a KV handle
(D's blocks live in one pod), and the headless Service gives each pod DNS and an EndpointSlice
entry the router watches. Why these pod details:
- the NIXL side channel binds and advertises `VLLM_NIXL_SIDE_CHANNEL_HOST`: the pod IP, from the
  downward API (the entrypoint copies `POD_IP` into it);
- EFA needs the `vpc.amazonaws.com/efa` devices, IPC_LOCK to register memory (or a privileged
  container, `spec.efa.privileged`, where registering GPU memory needs more), hugepages;
- the engine writes why it failed, when the resource holds the fix, to its termination message
  (the entrypoint); where it could not, the log's tail stands in (FallbackToLogsOnError);
- model loading takes minutes: a startup probe with a long budget guards the readiness probe;
- the config hash annotation rolls pods on any change; the engine revision rolls both roles;
- a chat template from a ConfigMap key is mounted read-only where `--chat-template` names it;
- the lease token (the router's key to D's lease API) comes from the deployment's Secret by
  reference, so its value never enters the config hash;
- decode's RollingUpdate partition holds its pods while prefill rolls (see rollout.py).
"""

from __future__ import annotations

from typing import Any

from boomerang.facts.engine import (
    HTTP_PORT,
    KV_EVENTS_PORT_OFFSET,
    KV_REPLAY_PORT_OFFSET,
    SIDE_CHANNEL_PORTS,
    Role,
)
from boomerang.operator import render
from boomerang.operator.api import ConfigMapKeyRef, DisaggregatedDeployment
from boomerang.operator.merge import deep_merge

STARTUP_BUDGET_S = 1800
CACHE_DIR = "/var/cache/boomerang"
CACHE_ENV = {"HF_HOME": f"{CACHE_DIR}/huggingface", "BOOMERANG_CACHE": CACHE_DIR}
"""Downloads (Hugging Face) and builtin models go to the cache volume, not the container."""


def build_headless_service(dd: DisaggregatedDeployment, role: Role) -> dict[str, Any]:
    """Per-pod DNS and the EndpointSlices the router watches (ready pods only)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": render.child_name(dd, role),
            "namespace": dd.namespace,
            "labels": render.labels(dd, role),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": render.selector_labels(dd, role),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "nixl-side",
                    "port": SIDE_CHANNEL_PORTS[role],
                    "targetPort": "nixl-side",
                    "protocol": "TCP",
                },
            ],
        },
    }


def build_statefulset(
    dd: DisaggregatedDeployment, role: Role, *, held: bool = False
) -> dict[str, Any]:
    """The engine StatefulSet of one role; `held` keeps every pod at the old revision.

    The partition is always rendered (0 when not held), so a steady-state apply changes nothing.
    """
    spec = render.role_spec(dd, role)
    partition = spec.replicas if held else 0
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": render.child_name(dd, role),
            "namespace": dd.namespace,
            "labels": render.labels(dd, role),
        },
        "spec": {
            "replicas": spec.replicas,
            "serviceName": render.child_name(dd, role),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
            "selector": {"matchLabels": render.selector_labels(dd, role)},
            "template": pod_template(dd, role),
            **_cache_claims(dd, role),
        },
    }


def pod_template(dd: DisaggregatedDeployment, role: Role) -> dict[str, Any]:
    """One role's pod template, stamped with the hash of its own content."""
    template = _pod_template(dd, role)
    template["metadata"]["annotations"][render.ANNOTATION_CONFIG_HASH] = render.stable_hash(
        template
    )
    return template


def config_hash(dd: DisaggregatedDeployment, role: Role) -> str:
    """The config hash one role's pods carry once they run the desired spec."""
    return str(pod_template(dd, role)["metadata"]["annotations"][render.ANNOTATION_CONFIG_HASH])


def _cache_claims(dd: DisaggregatedDeployment, role: Role) -> dict[str, Any]:
    """A persistent model cache: one claim per pod, kept by the StatefulSet across restarts."""
    cache = dd.spec.model.cache
    if not cache.persistent:
        return {}
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name:
        claim["storageClassName"] = cache.storage_class_name
    return {
        "volumeClaimTemplates": [
            {"metadata": {"name": "cache", "labels": render.labels(dd, role)}, "spec": claim}
        ]
    }


def _pod_template(dd: DisaggregatedDeployment, role: Role) -> dict[str, Any]:
    spec = render.role_spec(dd, role)
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
        "enableServiceLinks": False,
        # Engines never call the Kubernetes API: no token unless a ServiceAccount is asked for
        # (IRSA for s3:// models). The default seccomp profile of the runtime always.
        "automountServiceAccountToken": spec.service_account_name is not None,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_engine_container(dd, role)],
        "volumes": _volumes(dd, role),
        "affinity": _affinity(dd, role),
    }
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [dict(t) for t in spec.tolerations]
    template = {
        "metadata": {
            "labels": render.labels(dd, role),
            "annotations": {render.ANNOTATION_ENGINE_REVISION: render.engine_revision(dd)},
        },
        "spec": pod,
    }
    return deep_merge(template, spec.pod_template)


def _engine_container(dd: DisaggregatedDeployment, role: Role) -> dict[str, Any]:
    spec = render.role_spec(dd, role)
    container: dict[str, Any] = {
        "name": "engine",
        "image": dd.spec.engine.image,
        "imagePullPolicy": dd.spec.engine.image_pull_policy,
        "command": ["boomerang-engine", "--"],
        "args": render.engine_args(dd, role),
        "env": _env(dd, role),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "nixl-side", "containerPort": SIDE_CHANNEL_PORTS[role], "protocol": "TCP"},
            {"name": "kv-events", "containerPort": HTTP_PORT + KV_EVENTS_PORT_OFFSET},
            {"name": "kv-replay", "containerPort": HTTP_PORT + KV_REPLAY_PORT_OFFSET},
        ],
        "resources": _resources(dd, role),
        "volumeMounts": _mounts(dd, role),
        "startupProbe": _probe(period=10, failures=STARTUP_BUDGET_S // 10),
        "readinessProbe": _probe(period=5, failures=3),
        "livenessProbe": _probe(period=15, failures=8),
        # Let the router see the pod leave its EndpointSlice before vLLM stops accepting work.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "10"]}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.resources.efa > 0:
        context: dict[str, Any] = {"capabilities": {"add": ["IPC_LOCK"]}}
        if dd.spec.efa.privileged:
            context["privileged"] = True
        container["securityContext"] = context
    return container


def _probe(period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _env(dd: DisaggregatedDeployment, role: Role) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    literal = {**render.engine_env(dd, role), **CACHE_ENV}
    env += [{"name": k, "value": v} for k, v in sorted(literal.items())]
    env.append(render.lease_token_env(dd))  # the lease API both roles serve (the router calls D)
    env += [
        {"name": var.name, "valueFrom": dict(var.value_from)}
        for var in render.user_env(dd, role)
        if var.value_from is not None
    ]
    return env


def _resources(dd: DisaggregatedDeployment, role: Role) -> dict[str, Any]:
    res = render.role_spec(dd, role).resources
    amounts: dict[str, Any] = {}
    if res.cpu is not None:
        amounts["cpu"] = res.cpu
    if res.memory is not None:
        amounts["memory"] = res.memory
    if res.gpus:
        amounts["nvidia.com/gpu"] = res.gpus
    if res.efa:
        amounts["vpc.amazonaws.com/efa"] = res.efa
    if res.hugepages2_mi is not None:
        amounts["hugepages-2Mi"] = res.hugepages2_mi
    cache = dd.spec.model.cache
    if cache.size is not None and not cache.persistent:
        amounts["ephemeral-storage"] = cache.size  # the node-local cache counts against it
    if not amounts:
        return {}
    # Extended resources and hugepages need requests == limits; engines get Guaranteed QoS.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _model_claim(dd: DisaggregatedDeployment) -> str | None:
    source = dd.spec.model.source
    if not source.startswith("pvc://"):
        return None
    return source.removeprefix("pvc://").split("/", 1)[0]


def _volumes(dd: DisaggregatedDeployment, role: Role) -> list[dict[str, Any]]:
    res = render.role_spec(dd, role).resources
    volumes: list[dict[str, Any]] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size}},
    ]
    cache = dd.spec.model.cache
    if not cache.persistent:  # else the StatefulSet's claim named `cache`
        local: dict[str, Any] = {"sizeLimit": cache.size} if cache.size else {}
        volumes.append({"name": "cache", "emptyDir": local})
    claim = _model_claim(dd)
    if claim:
        volumes.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    if res.hugepages2_mi is not None:
        volumes.append({"name": "hugepages", "emptyDir": {"medium": "HugePages-2Mi"}})
    template = _template_key(dd)
    if template is not None:
        item = {"key": template.key, "path": template.key}
        volumes.append(
            {"name": "chat-template", "configMap": {"name": template.name, "items": [item]}}
        )
    return volumes


def _mounts(dd: DisaggregatedDeployment, role: Role) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "cache", "mountPath": CACHE_DIR},
    ]
    if _model_claim(dd):
        mounts.append({"name": "models", "mountPath": render.MODELS_DIR, "readOnly": True})
    if render.role_spec(dd, role).resources.hugepages2_mi is not None:
        mounts.append({"name": "hugepages", "mountPath": "/hugepages-2Mi"})
    if _template_key(dd) is not None:
        mounts.append(
            {"name": "chat-template", "mountPath": render.CHAT_TEMPLATE_DIR, "readOnly": True}
        )
    return mounts


def _template_key(dd: DisaggregatedDeployment) -> ConfigMapKeyRef | None:
    """The ConfigMap key the chat template comes from, if it comes from one."""
    ref = dd.spec.model.chat_template
    return ref.config_map_key_ref if ref is not None else None


def _affinity(dd: DisaggregatedDeployment, role: Role) -> dict[str, Any]:
    """Spread a role across nodes; keep it near the other role when placement asks for it."""
    spread = {
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": render.selector_labels(dd, role)},
            "topologyKey": "kubernetes.io/hostname",
        },
    }
    affinity: dict[str, Any] = {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [spread]}
    }
    placement = dd.spec.placement
    if placement.topology_key:
        other: Role = "decode" if role == "prefill" else "prefill"
        term = {
            "labelSelector": {"matchLabels": render.selector_labels(dd, other)},
            "topologyKey": placement.topology_key,
        }
        if placement.required and role == "decode":
            # Only one side may *require* the other, or neither could ever schedule first.
            affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        else:
            affinity["podAffinity"] = {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": term}
                ]
            }
    return deep_merge(affinity, render.role_spec(dd, role).affinity)
