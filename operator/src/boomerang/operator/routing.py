"""Pure builders for the router: config, Deployment, Service, and the RBAC it needs.

The router watches the EndpointSlices of the two headless Services to learn which engine pods
are ready, so it gets its own ServiceAccount with read access to EndpointSlices in its namespace
and nothing else. Its configuration is the router's own `RouterConfig`, rendered to YAML in a
ConfigMap; secrets (Redis URL, API keys, the lease token for D's lease API) come from Secrets as
env and a mounted file. The router reloads its `tuning` section from the mounted file while it
runs, so that section is kept out of the pods' config hash: tuning changes restart no pod.
"""

from __future__ import annotations

from typing import Any

import yaml

from boomerang.operator import render
from boomerang.operator.api import DisaggregatedDeployment
from boomerang.operator.merge import deep_merge

COMPONENT = "router"


def _meta(dd: DisaggregatedDeployment, name: str | None = None) -> dict[str, Any]:
    return {
        "name": name or render.child_name(dd, COMPONENT),
        "namespace": dd.namespace,
        "labels": render.labels(dd, COMPONENT),
    }


def router_config_yaml(dd: DisaggregatedDeployment) -> str:
    return yaml.safe_dump(render.router_config(dd), sort_keys=True)


def restart_config_yaml(dd: DisaggregatedDeployment) -> str:
    """The part of the router's configuration it reads only at start: what the pods' config
    hash covers. The sections it reloads while running (`tuning`) are left out, so changing
    them updates the ConfigMap (kubelet refreshes the mounted file) and restarts no pod."""
    config = render.router_config(dd)
    static = {k: v for k, v in config.items() if k not in render.ROUTER_RELOADED_KEYS}
    return yaml.safe_dump(static, sort_keys=True)


def build_config_map(dd: DisaggregatedDeployment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(dd),
        "data": {render.ROUTER_CONFIG_KEY: router_config_yaml(dd)},
    }


def build_service_account(dd: DisaggregatedDeployment) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(dd)}


def build_role(dd: DisaggregatedDeployment) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(dd),
        "rules": [
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }


def build_role_binding(dd: DisaggregatedDeployment) -> dict[str, Any]:
    name = render.child_name(dd, COMPONENT)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(dd),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": dd.namespace}],
    }


def build_service(dd: DisaggregatedDeployment) -> dict[str, Any]:
    """Clients' entry point. With the in-memory store and several replicas, client-IP affinity
    keeps a client's conversations on the replica that holds their handles."""
    router = dd.spec.router
    spec: dict[str, Any] = {
        "type": router.service.type,
        "selector": render.selector_labels(dd, COMPONENT),
        "ports": [
            {"name": "http", "port": router.service.port, "targetPort": "http", "protocol": "TCP"}
        ],
    }
    if router.store.type == "memory" and router.replicas > 1:
        spec["sessionAffinity"] = "ClientIP"
    if router.service.load_balancer_source_ranges:
        spec["loadBalancerSourceRanges"] = list(router.service.load_balancer_source_ranges)
    meta = _meta(dd)
    if router.service.annotations:
        meta["annotations"] = dict(router.service.annotations)
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def build_deployment(dd: DisaggregatedDeployment) -> dict[str, Any]:
    router = dd.spec.router
    pod: dict[str, Any] = {
        "serviceAccountName": render.child_name(dd, COMPONENT),
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "fsGroup": 65532},
        # preStop, then the drain of the turns in flight (`render.router_drain_s`), then exit
        "terminationGracePeriodSeconds": router.termination_grace_period_seconds,
        "containers": [_container(dd)],
        "volumes": _volumes(dd),
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": render.selector_labels(dd, COMPONENT)},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
    }
    if router.node_selector:
        pod["nodeSelector"] = dict(router.node_selector)
    if router.tolerations:
        pod["tolerations"] = [dict(t) for t in router.tolerations]
    template = deep_merge(
        {"metadata": {"labels": render.labels(dd, COMPONENT), "annotations": {}}, "spec": pod},
        router.pod_template,
    )
    config_hash = render.stable_hash([template, restart_config_yaml(dd)])
    template["metadata"]["annotations"][render.ANNOTATION_CONFIG_HASH] = config_hash
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(dd),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": render.selector_labels(dd, COMPONENT)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": template,
        },
    }


def _container(dd: DisaggregatedDeployment) -> dict[str, Any]:
    router = dd.spec.router
    env: list[dict[str, Any]] = [render.lease_token_env(dd)]  # to release and renew D's leases
    ref = router.store.url_secret_ref
    if ref is not None:
        env.append(
            {
                "name": "BOOMERANG_REDIS_URL",
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        )
    mounts = [{"name": "config", "mountPath": render.ROUTER_CONFIG_DIR, "readOnly": True}]
    if router.api_key_secret_ref is not None:
        mounts.append({"name": "api-keys", "mountPath": render.API_KEYS_DIR, "readOnly": True})
    probe = {"periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3}
    return {
        "name": "router",
        "image": router.image,
        "command": ["boomerang-router"],
        "args": ["--config", f"{render.ROUTER_CONFIG_DIR}/{render.ROUTER_CONFIG_KEY}"],
        "env": env,
        "ports": [{"name": "http", "containerPort": render.ROUTER_PORT, "protocol": "TCP"}],
        "resources": router.resources.model_dump(),
        "volumeMounts": mounts,
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, **probe},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, **probe},
        # Serve on while the Service stops sending here; SIGTERM then stops the listener.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(render.ROUTER_PRESTOP_S)]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _volumes(dd: DisaggregatedDeployment) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": render.child_name(dd, COMPONENT)}}
    ]
    ref = dd.spec.router.api_key_secret_ref
    if ref is not None:
        volumes.append(
            {
                "name": "api-keys",
                "secret": {"secretName": ref.name, "items": [{"key": ref.key, "path": ref.key}]},
            }
        )
    return volumes
