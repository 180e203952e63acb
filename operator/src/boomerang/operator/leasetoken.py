"""The lease token: the shared secret between a deployment's router and its engines.

D's lease API (release and renew a finished request's blocks, served by Boomerang's vLLM plugin)
frees memory other conversations are using, so only the router may call it: the engines accept
a call only with `Authorization: Bearer <token>`, and the router sends it. Both read the token
from env `BOOMERANG_LEASE_TOKEN`, which the operator fills from one Secret per deployment,
`<name>-lease-token` (key `token`, 32 random bytes in hex).

The Secret is created once, when missing, and never written again: a reconcile never rotates
the token (it would have to restart every pod to take effect, and the pods that had not would
lose control of their leases). The operator may create Secrets and do nothing else with them
(no get, list or watch: it holds no Secret's data), so each full reconcile creates it blind and
an existing one answers 409. Deleting it issues a new one at the next full reconcile (within
the repair interval), which pods take up when they next start; until then the router's calls
to engines with another token are refused, and it falls back to D's own TTL, as without the
lease API. A Secret of that name made beforehand (with a `token` key) is used as it is.
"""

from __future__ import annotations

import base64
import logging
import secrets
from typing import Any

from boomerang.operator import render
from boomerang.operator.api import DisaggregatedDeployment
from boomerang.operator.children import owner_reference
from boomerang.operator.kube import KubeAPI

log = logging.getLogger(__name__)
COMPONENT = "lease-token"
TOKEN_BYTES = 32


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


def build_secret(dd: DisaggregatedDeployment, token: str) -> dict[str, Any]:
    """The token's Secret, owned by `dd` (when it has a uid) like every other child."""
    meta: dict[str, Any] = {
        "name": render.lease_token_secret(dd),
        "namespace": dd.namespace,
        "labels": render.labels(dd, COMPONENT),
    }
    uid = dd.metadata.get("uid")
    if uid:
        meta["ownerReferences"] = [owner_reference(dd, str(uid))]
    encoded = base64.b64encode(token.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {render.LEASE_TOKEN_KEY: encoded},
    }


def ensure(dd: DisaggregatedDeployment, kube: KubeAPI) -> bool:
    """Create the token's Secret unless it exists; True when this call created it.

    A blind create, not a read and an apply: the operator may create Secrets and nothing else,
    so it never holds any Secret's data. One that exists (an earlier reconcile's, a concurrent
    one's, the user's) answers 409 and stays as it is.
    """
    if kube.create(build_secret(dd, new_token())) is None:
        return False
    log.info("Created Secret name=%s namespace=%s", render.lease_token_secret(dd), dd.namespace)
    return True
