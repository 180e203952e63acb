"""Every object a `DisaggregatedDeployment` owns, as one ordered list of pure builders.

The reconciler applies this list as a whole each time (level-based, never "create if missing"),
so drift in any child is corrected and a spec change reaches every child it affects. The order
puts what others reference first (RBAC and config before the pods that use them).

`CHILD_KINDS` is the one table of the kinds those children are: the API client's paths
(kube.py), the watches that repair drift (handlers.py) and the chart's RBAC (a test checks it
grants exactly these) all read it. A builder of a new kind adds its row here. `CREATED_KINDS`
and `CREATE_ONLY_KINDS` are the children created once and never applied again (a role's
scaler; the lease token, which the operator may not even read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from boomerang.facts.engine import ROLES
from boomerang.operator import engines, policy, routing
from boomerang.operator.api import API_VERSION, KIND, DisaggregatedDeployment


@dataclass(frozen=True)
class Kind:
    """One Kubernetes kind: how objects name it, and where the API serves it."""

    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        """The API group (`""` for the core group), as RBAC rules and watches name it."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def path(self) -> str:
        """The API path prefix: `/api/v1` for the core group, `/apis/<group>/<version>` else."""
        return f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"


CHILD_KINDS: tuple[Kind, ...] = (
    Kind("apps/v1", "StatefulSet", "statefulsets"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("v1", "Service", "services"),
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
)
"""Every kind `desired_children` builds (a test holds them equal)."""

CREATED_KINDS: tuple[Kind, ...] = (
    Kind(API_VERSION, "DisaggregatedRoleScaler", "disaggregatedrolescalers"),
)
"""Kinds the operator creates once when missing and never applies again (a role's scaler,
scaling.py: its spec belongs to whoever scales it). The chart grants them the same verbs."""

CREATE_ONLY_KINDS: tuple[Kind, ...] = (Kind("v1", "Secret", "secrets"),)
"""Kinds the operator may create and nothing else: not read, list, watch or patch. The lease
token's Secret (leasetoken.py) is created blind, an existing one answering 409, so the operator
never reads a Secret's data; a deleted token is created anew by the next full reconcile."""


def desired_children(
    dd: DisaggregatedDeployment, *, decode_held: bool = False
) -> list[dict[str, Any]]:
    """All children, each owned by `dd` so that deleting it garbage-collects them.

    `decode_held` keeps decode's pods at their old revision while prefill rolls (rollout.py).
    """
    objects: list[dict[str, Any]] = [
        routing.build_service_account(dd),
        routing.build_role(dd),
        routing.build_role_binding(dd),
        routing.build_config_map(dd),
    ]
    for role in ROLES:
        objects.append(engines.build_headless_service(dd, role))
        held = decode_held and role == "decode"
        objects.append(engines.build_statefulset(dd, role, held=held))
    objects.append(routing.build_service(dd))
    objects.append(routing.build_deployment(dd))
    objects += [policy.build_pdb(dd, component) for component in policy.COMPONENTS]
    objects.append(policy.build_network_policy(dd))
    uid = dd.metadata.get("uid")
    if uid:
        for obj in objects:
            obj["metadata"]["ownerReferences"] = [owner_reference(dd, str(uid))]
    return objects


def owner_reference(dd: DisaggregatedDeployment, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": dd.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
