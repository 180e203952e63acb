"""The EndpointSlice watcher's list/watch I/O against an HTTP server speaking the API's shapes.

The pure event handling is tested in test_units; the real control plane (e2e) exercises the
same code with a real apiserver.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from boomerang.router.config import KubernetesSource
from boomerang.router.discovery import ApiAccess, SliceWatcher


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
