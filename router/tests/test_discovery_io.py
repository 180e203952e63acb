"""The EndpointSlice watcher's list/watch I/O against an HTTP server speaking the API's shapes.

The pure event handling is tested in test_units; the real control plane (e2e) exercises the
same code with a real apiserver. The token tests rotate a projected service-account token the
way the kubelet does (a new directory, then a `..data` symlink swap).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from boomerang.router.config import KubernetesSource
from boomerang.router.engines.discovery import ApiAccess, SliceWatcher, api_access


def _slice(name: str, rv: str, *ips: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip in ips],
    }


async def test_watcher_lists_then_follows_watch_events() -> None:
    seen_queries: list[dict[str, str]] = []

    async def slices(request: web.Request) -> web.StreamResponse:
        seen_queries.append(dict(request.query))
        assert request.headers["Authorization"] == "Bearer t"
        if "watch" not in request.query:
            return web.json_response(
                {"metadata": {"resourceVersion": "5"}, "items": [_slice("a", "5", "10.0.0.1")]}
            )
        resp = web.StreamResponse()
        await resp.prepare(request)
        events = [
            {"type": "MODIFIED", "object": _slice("a", "6", "10.0.0.1", "10.0.0.2")},
            {"type": "ADDED", "object": _slice("b", "7", "10.0.0.3", ready=False)},
        ]
        for event in events:
            await resp.write(json.dumps(event).encode() + b"\n")
        await asyncio.sleep(5)
        return resp

    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices", slices)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    updates: list[list[str]] = []
    access = ApiAccess(str(server.make_url("")).rstrip("/"), {"Authorization": "Bearer t"}, False)
    watcher = SliceWatcher(
        KubernetesSource(namespace="ns", service="svc", port=8000), access, updates.append
    )
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(watcher.run(session))
        for _ in range(50):
            if len(updates) >= 3:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await server.close()
    assert updates[0] == ["http://10.0.0.1:8000"]
    assert updates[-1] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert seen_queries[0]["labelSelector"] == "kubernetes.io/service-name=svc"
    assert seen_queries[1]["resourceVersion"] == "5" and seen_queries[1]["watch"] == "1"


class TokenVolume:
    """A projected service-account token: `token` -> `..data/token`, rotated by symlink swap."""

    def __init__(self, root: Path, token: str) -> None:
        self.root, self.version = root, 0
        self.rotate(token)
        (root / "token").symlink_to("..data/token")

    @property
    def path(self) -> Path:
        return self.root / "token"

    def rotate(self, token: str) -> None:
        self.version += 1
        new = self.root / f"..v{self.version}"
        new.mkdir()
        (new / "token").write_text(token + "\n")
        (self.root / "..data_tmp").symlink_to(new.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")


class OneTokenApi:
    """An API server that accepts only `current`; each watch sends one event, then ends."""

    def __init__(self) -> None:
        self.current = "t1"
        self.seen: list[tuple[str, int]] = []  # (Authorization, status) per request
        self.rv = 5

    async def slices(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if auth != f"Bearer {self.current}":
            self.seen.append((auth, 401))
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        self.seen.append((auth, 200))
        self.rv += 1
        if "watch" not in request.query:
            items = [_slice("a", str(self.rv), "10.0.0.1")]
            return web.json_response(
                {"metadata": {"resourceVersion": str(self.rv)}, "items": items}
            )
        resp = web.StreamResponse()
        await resp.prepare(request)
        event = {"type": "MODIFIED", "object": _slice("a", str(self.rv), "10.0.0.1")}
        await resp.write(json.dumps(event).encode() + b"\n")
        await asyncio.sleep(0.02)
        return resp  # the watch ends (timeoutSeconds): the watcher reconnects

    async def until_ok_with(self, token: str) -> None:
        for _ in range(200):
            if (f"Bearer {token}", 200) in self.seen:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"no accepted request with {token}: {self.seen[-5:]}")


async def test_watcher_rereads_a_rotated_service_account_token(tmp_path: Path) -> None:
    api = OneTokenApi()
    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices", api.slices)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    volume = TokenVolume(tmp_path, "t1")
    access = ApiAccess(str(server.make_url("")).rstrip("/"), {}, False, token_file=volume.path)
    source = KubernetesSource(namespace="ns", service="svc", port=8000)
    watcher = SliceWatcher(source, access, lambda urls: None, retry_s=0.02)
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(watcher.run(session))
        await api.until_ok_with("t1")
        volume.rotate("t2")  # the kubelet rotates first; the old token is still valid a while
        api.current = "t2"
        await api.until_ok_with("t2")
        first_t2 = [auth for auth, _ in api.seen].index("Bearer t2")
        assert "Bearer t1" not in [auth for auth, _ in api.seen[first_t2:]]
        api.current = "t3"  # the server stops accepting t2 before the file changes: 401s
        await asyncio.sleep(0.1)
        assert ("Bearer t2", 401) in api.seen
        volume.rotate("t3")
        await api.until_ok_with("t3")
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await server.close()


def test_in_cluster_access_reads_the_token_file_for_each_request(tmp_path: Path) -> None:
    import certifi

    shutil.copy(certifi.where(), tmp_path / "ca.crt")
    volume = TokenVolume(tmp_path, "t1")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    access = api_access(tmp_path, env)
    assert access.server == "https://10.96.0.1:443"
    assert access.request_headers() == {"Authorization": "Bearer t1"}
    volume.rotate("t2")
    assert access.request_headers() == {"Authorization": "Bearer t2"}
