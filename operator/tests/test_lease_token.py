"""The lease token: one Secret per deployment, created once and never rotated, given to both
engine roles and the router by reference, so its value never rolls a pod."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import kubernetes_validate
from dd_testing import deployment
from test_children import K8S_VERSION, UID
from test_reconcile import NOW, MemoryKube, body

from boomerang.operator import engines, leasetoken, render
from boomerang.operator.children import CREATE_ONLY_KINDS, desired_children
from boomerang.operator.reconcile import reconcile

SECRET = ("Secret", "minimal-lease-token")


def _token(secret: dict[str, Any]) -> str:
    return base64.b64decode(secret["data"]["token"]).decode()


def _env(obj: dict[str, Any]) -> dict[str, Any]:
    container = obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container["env"]}


def test_the_secret_holds_32_random_bytes_in_hex_and_is_owned() -> None:
    dd = deployment(uid=UID)
    secret = leasetoken.build_secret(dd, leasetoken.new_token())
    assert re.fullmatch(r"[0-9a-f]{64}", _token(secret))
    assert leasetoken.new_token() != leasetoken.new_token()
    meta = secret["metadata"]
    assert meta["name"] == "minimal-lease-token" and meta["namespace"] == "default"
    assert meta["ownerReferences"][0]["uid"] == UID
    assert meta["labels"]["app.kubernetes.io/managed-by"] == render.MANAGER
    kubernetes_validate.validate(json.loads(json.dumps(secret)), K8S_VERSION, strict=True)


def test_engines_and_router_read_the_token_from_the_secret() -> None:
    objs = desired_children(deployment(uid=UID))
    workloads = [o for o in objs if o["kind"] in ("StatefulSet", "Deployment")]
    assert len(workloads) == 3  # prefill, decode, router
    for obj in workloads:
        assert _env(obj)[render.LEASE_TOKEN_ENV] == {
            "name": "BOOMERANG_LEASE_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "minimal-lease-token", "key": "token"}},
        }, obj["metadata"]["name"]


def test_the_token_is_a_kind_the_operator_may_create_and_nothing_more() -> None:
    assert {(k.api_version, k.kind) for k in CREATE_ONLY_KINDS} == {("v1", "Secret")}
    assert "Secret" not in {o["kind"] for o in desired_children(deployment(uid=UID))}


def test_a_reconcile_creates_the_token_once_and_never_rotates_it() -> None:
    kube = MemoryKube(body())
    reconcile(kube.owner, kube, NOW)
    first = kube.created[SECRET]
    assert first["metadata"]["namespace"] == "team-a"
    assert first["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    hashes = {r: engines.config_hash(deployment(), r) for r in ("prefill", "decode")}
    for _ in range(2):
        reconcile(kube.owner, kube, NOW)
    assert kube.created[SECRET] == first
    assert ("Secret", "minimal-lease-token") not in kube.applied  # created, never applied
    assert {r: engines.config_hash(deployment(), r) for r in hashes} == hashes


def test_a_deleted_token_is_created_anew() -> None:
    kube = MemoryKube(body())
    reconcile(kube.owner, kube, NOW)
    old = _token(kube.created.pop(SECRET))
    reconcile(kube.owner, kube, NOW)
    assert _token(kube.created[SECRET]) != old


def test_a_token_made_beforehand_is_kept() -> None:
    kube = MemoryKube(body())
    mine = {"kind": "Secret", "metadata": {"name": SECRET[1]}, "data": {"token": "eA=="}}
    kube.created[SECRET] = mine
    reconcile(kube.owner, kube, NOW)
    assert kube.created[SECRET] == mine


class _BlindKube(MemoryKube):
    """Refuses every read of a Secret, as the operator's RBAC does."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert kind != "Secret", "the operator may not read Secrets"
        return super().get(api_version, kind, namespace, name)


def test_the_token_is_created_without_reading_any_secret() -> None:
    kube = _BlindKube(body())
    dd = deployment(namespace="team-a")
    assert leasetoken.ensure(dd, kube) is True
    first = kube.created[SECRET]
    assert leasetoken.ensure(dd, kube) is False  # the API server's 409: the first one stands
    assert kube.created[SECRET] == first
    reconcile(kube.owner, kube, NOW)
    assert kube.created[SECRET] == first


def test_a_token_that_cannot_be_created_degrades_status_and_the_children_still_apply() -> None:
    kube = MemoryKube(body(), fail_kind="Secret")
    outcome = reconcile(kube.owner, kube, NOW)
    degraded = next(c for c in outcome.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ReconcileFailed"
    assert degraded["message"].startswith("Secret minimal-lease-token not created: ")
    assert len(kube.objects) == 14
