"""The operator's only I/O with the Kubernetes API: a thin, typed layer over the REST client.

Everything the reconciler does to the cluster goes through `Kube`: server-side apply of a child
under one field manager, reading a workload, listing a role's pods and the nodes they may run
on (to say why pods are not ready), writing the status subresource. Keeping it this
small makes the reconciler testable with an in-memory double and the end-to-end suite easy to
write against a real API server. Paths come from a static table (no discovery round trips):
the children's kinds (children.CHILD_KINDS), plus what the operator only reads and its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from boomerang.operator import api
from boomerang.operator.children import CHILD_KINDS, CREATE_ONLY_KINDS, CREATED_KINDS, Kind
from boomerang.operator.render import MANAGER

REQUEST_TIMEOUT_S = 30
ACCESS_TTL_S = 600.0
"""How long the answer to "may I list this cluster-scoped kind?" is trusted."""

_READ_ONLY = (Kind("v1", "Pod", "pods"), Kind("v1", "Node", "nodes"))
_OWN = Kind(api.API_VERSION, api.KIND, api.PLURAL)
# (apiVersion, kind) -> (path prefix, plural)
_RESOURCES: Mapping[tuple[str, str], tuple[str, str]] = {
    (k.api_version, k.kind): (k.path, k.plural)
    for k in (*CHILD_KINDS, *CREATED_KINDS, *CREATE_ONLY_KINDS, *_READ_ONLY, _OWN)
}


class KubeError(Exception):
    """An API call failed; `reason` is short enough for a condition message."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class KubeAPI(Protocol):
    """What the reconciler needs from the cluster."""

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create an object once: None when one of that name exists already."""
        ...

    def get(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None: ...

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...

    def apply_status(self, obj: Mapping[str, Any]) -> None:
        """Server-side apply of another kind's status subresource (a role's scaler)."""
        ...

    def list_objects(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]: ...


def collection_path(api_version: str, kind: str, namespace: str | None) -> str:
    """A kind's collection in one namespace, or cluster-wide (`namespace=None`: nodes)."""
    try:
        prefix, plural = _RESOURCES[(api_version, kind)]
    except KeyError:
        raise KubeError(f"unsupported kind {api_version}/{kind}") from None
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    try:
        prefix, plural = _RESOURCES[(api_version, kind)]
    except KeyError:
        raise KubeError(f"unsupported kind {api_version}/{kind}") from None
    return f"{prefix}/namespaces/{namespace}/{plural}/{name}"


class Kube:
    """`KubeAPI` over the official client; loads in-cluster config or KUBECONFIG."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        if api_client is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]
            api_client = client.ApiClient()
        self._client = api_client
        self._access: dict[str, tuple[bool, float]] = {}

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        try:
            request = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(*request[:4], _request_timeout=REQUEST_TIMEOUT_S)
            response.read()  # type: ignore[no-untyped-call]
        except (ApiException, OSError) as exc:
            raise KubeError(f"{method} {path}: {exc}") from exc
        if response.status >= 400:
            raise KubeError(_reason(response.status, response.data), response.status)
        return dict(json.loads(response.data or b"{}"))

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply under the operator's field manager, taking ownership of conflicts."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", MANAGER), ("force", "true")]
        return self._call("PATCH", path, dict(obj), "application/apply-patch+yaml", query)

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        meta = obj["metadata"]
        path = collection_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        try:
            return self._call("POST", path, dict(obj), query=[("fieldManager", MANAGER)])
        except KubeError as exc:
            if exc.status == 409:
                return None
            raise

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", object_path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        path = object_path(api.API_VERSION, api.KIND, namespace, name) + "/status"
        self._call("PATCH", path, {"status": dict(status)}, "application/merge-patch+json")

    def apply_status(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", MANAGER), ("force", "true")]
        self._call("PATCH", path + "/status", dict(obj), "application/apply-patch+yaml", query)

    def list_objects(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Objects whose labels match `labels` exactly, filtered by the API server."""
        if namespace is None and not self._may_list(_RESOURCES[(api_version, kind)][1]):
            raise KubeError(f"not allowed to list {kind} cluster-wide", 403)
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        query = [("labelSelector", selector)] if selector else []
        found = self._call("GET", collection_path(api_version, kind, namespace), query=query)
        return list(found.get("items") or [])

    def _may_list(self, plural: str) -> bool:
        """Ask before listing a cluster-scoped kind: a namespaced install is not granted nodes,
        and a request it is refused would show as a denial in the audit log, every time."""
        known = self._access.get(plural)
        if known is not None and time.monotonic() - known[1] < ACCESS_TTL_S:
            return known[0]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "list", "resource": plural}},
        }
        path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        allowed = bool(self._call("POST", path, review).get("status", {}).get("allowed"))
        self._access[plural] = (allowed, time.monotonic())
        return allowed


def _reason(status: int, data: bytes | None) -> str:
    try:
        message = json.loads(data or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"HTTP {status}")[:500]
