"""Pure builders for disruption and network policy.

PodDisruptionBudgets keep voluntary evictions (node drains, upgrades) to one pod at a time per
role, so a drain never takes all of P or all of D at once. The NetworkPolicy exists because
vLLM's NIXL side channel and KV reads are unauthenticated: only this deployment's own pods (the
router and the engines) may reach the engines at all. One operator-wide exception: the pods of
the Prometheus namespace (`--metrics-namespace`, env `BOOMERANG_PROMETHEUS_NAMESPACE`, the
chart's `monitoring.prometheusNamespace`) may reach the engines' HTTP port, for `/metrics`.
"""

from __future__ import annotations

import os
from typing import Any

from boomerang.facts.engine import HTTP_PORT, ROLES
from boomerang.operator import render
from boomerang.operator.api import DisaggregatedDeployment

COMPONENTS = (*ROLES, "router")
PROMETHEUS_NAMESPACE_ENV = "BOOMERANG_PROMETHEUS_NAMESPACE"
_NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server


def prometheus_namespace() -> str | None:
    """The operator-wide namespace whose pods may scrape the engines (None: none).

    Read from the environment, which the operator's `--metrics-namespace` flag sets: an
    operator setting rather than a field of each resource, like the Prometheus it names."""
    return os.environ.get(PROMETHEUS_NAMESPACE_ENV, "").strip() or None


def build_pdb(dd: DisaggregatedDeployment, component: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": render.child_name(dd, component),
            "namespace": dd.namespace,
            "labels": render.labels(dd, component),
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": render.selector_labels(dd, component)},
        },
    }


def build_network_policy(
    dd: DisaggregatedDeployment, scraper_namespace: str | None = None
) -> dict[str, Any]:
    """Engines accept traffic (HTTP, side channel, NIXL data ports) only from this deployment,
    plus HTTP alone from `scraper_namespace` (default: `prometheus_namespace()`)."""
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": {render.LABEL_DEPLOYMENT: dd.name}}}]}
    ]
    scrapers = scraper_namespace or prometheus_namespace()
    if scrapers:
        peer = {"namespaceSelector": {"matchLabels": {_NAMESPACE_NAME_LABEL: scrapers}}}
        ingress.append({"from": [peer], "ports": [{"protocol": "TCP", "port": HTTP_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": render.child_name(dd, "engines"),
            "namespace": dd.namespace,
            "labels": render.labels(dd, "engines"),
        },
        "spec": {
            "podSelector": {
                "matchExpressions": [
                    {"key": render.LABEL_DEPLOYMENT, "operator": "In", "values": [dd.name]},
                    {"key": render.LABEL_ROLE, "operator": "In", "values": list(ROLES)},
                ]
            },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
