"""Every object a `DisaggregatedDeployment` owns, as one ordered list of pure builders.

The reconciler applies this list as a whole each time (level-based, never "create if missing"),
so drift in any child is corrected and a spec change reaches every child it affects. The order
puts what others reference first (RBAC and config before the pods that use them).
"""

from __future__ import annotations

from typing import Any

from boomerang.connector.config import ROLES
from boomerang.operator import engines, policy, routing
from boomerang.operator.api import API_VERSION, KIND, DisaggregatedDeployment


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
