"""The API server's audit log, read to prove what the operator's ServiceAccount was allowed.

RBAC denials are the one thing an operator's own log may hide (a retried call, a swallowed
error). The audit log is the API server's own record: every request a ServiceAccount made,
with the authorizer's decision, so a test can assert that not one was refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # ServiceAccounts only (the operator): the admin and the components stay out of it.
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def write_policy(path: Path) -> Path:
    path.write_text(json.dumps(POLICY))
    return path


@dataclass(frozen=True)
class AuditLog:
    path: Path

    def mark(self) -> int:
        """A position in the log, for `events(since=...)`."""
        return self.path.stat().st_size if self.path.exists() else 0

    def events(self, user: str, since: int = 0) -> list[dict[str, Any]]:
        """Completed requests of one user, written after `since`."""
        if not self.path.exists():
            return []
        with self.path.open() as log:
            log.seek(since)
            events = [json.loads(line) for line in log if line.strip()]
        return [
            e
            for e in events
            if e.get("user", {}).get("username") == user and e.get("stage") == "ResponseComplete"
        ]

    def denials(self, user: str, since: int = 0) -> list[str]:
        """`verb resource namespace` of every request of `user` that authorization refused.

        Only the authorizer's decision counts: a 403 from admission (e.g. creating in a
        terminating namespace) is not a missing permission.
        """
        return [
            f"{e['verb']} {_resource(e)} {e.get('objectRef', {}).get('namespace', '')}"
            for e in self.events(user, since)
            if (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid"
        ]


def _resource(event: dict[str, Any]) -> str:
    ref = event.get("objectRef", {})
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource += f"/{ref['subresource']}"
    return f"{resource}.{ref['apiGroup']}" if ref.get("apiGroup") else resource
