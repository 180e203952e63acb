"""Pure builders for disruption and network policy.

PodDisruptionBudgets keep voluntary evictions (node drains, upgrades) to one pod at a time per
role, so a drain never takes all of P or all of D at once. The NetworkPolicy exists because
vLLM's NIXL side channel and KV reads are unauthenticated: only this deployment's own pods (the
router and the engines) may reach the engines at all.
"""

from __future__ import annotations

from typing import Any

from boomerang.connector.config import ROLES
from boomerang.operator import render
from boomerang.operator.api import DisaggregatedDeployment

COMPONENTS = (*ROLES, "router")


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


def build_network_policy(dd: DisaggregatedDeployment) -> dict[str, Any]:
    """Engines accept traffic (HTTP, side channel, NIXL data ports) only from this deployment."""
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
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {render.LABEL_DEPLOYMENT: dd.name}}}]}
            ],
        },
    }
