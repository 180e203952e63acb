"""A small P/D world for router tests: fake engines on loopback and the router in front."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from router_testing import EngineSpec, Fabric, FakeEngine

from boomerang.router.app import create_app
from boomerang.router.config import RouterConfig


@dataclass
class World:
    """Engines, the router client and the shared fake NIXL fabric."""

    fabric: Fabric
    prefill: list[EngineSpec]
    decode: list[EngineSpec]
    client: TestClient[Any, Any]
    servers: list[TestServer] = field(default_factory=list)

    async def metric(self, name: str, **labels: str) -> float:
        """One sample of the router's /metrics (0 when absent)."""
        text = await (await self.client.get("/metrics")).text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0

    async def reuse(self, outcome: str) -> float:
        return await self.metric("boomerang_router_reuse_total", outcome=outcome)


WorldFactory = Callable[..., Any]


@pytest.fixture
async def world() -> AsyncIterator[WorldFactory]:
    """`await world(n_prefill=1, n_decode=1, **config_overrides, prefill_spec={}, ...)`; a
    role's spec may also be a list, one mapping per engine."""
    made: list[World] = []

    async def make(
        n_prefill: int = 1,
        n_decode: int = 1,
        prefill_spec: dict[str, Any] | list[dict[str, Any]] | None = None,
        decode_spec: dict[str, Any] | list[dict[str, Any]] | None = None,
        **config: Any,
    ) -> World:
        fabric = Fabric()
        specs: dict[str, list[EngineSpec]] = {"prefill": [], "decode": []}
        servers: list[TestServer] = []
        urls: dict[str, list[str]] = {"prefill": [], "decode": []}
        for role, n, extra in (
            ("prefill", n_prefill, prefill_spec),
            ("decode", n_decode, decode_spec),
        ):
            for i in range(n):
                own = extra[i] if isinstance(extra, list) else extra
                spec = EngineSpec(
                    role=role, engine_id=f"{role[0]}{i}", fabric=fabric, **(own or {})
                )
                server = TestServer(FakeEngine(spec).app(), host="127.0.0.1")
                await server.start_server()
                servers.append(server)
                specs[role].append(spec)
                urls[role].append(str(server.make_url("")).rstrip("/"))
        cfg = {
            "prefill": {"urls": urls["prefill"]},
            "decode": {"urls": urls["decode"]},
            # The idle decoder probe would add two calls to every D (`test_idle_probe.py`).
            "health": {"probe_interval_s": 0.2, "idle_probe": False},
            # The fake conversations are a few tokens long: under the engine's default
            # threshold (64) a real P recomputes them, and the router offers P only what it
            # would pull. Tests of the threshold set their own.
            "recompute_threshold": 0,
            # The mechanics these tests check are the P/D flow's; adaptive tests say so. The
            # fake P has no prefix cache: no placement to keep a conversation on (affinity
            # tests say so), or static would let every handle go (P would hold the history).
            "tuning": {"mode": "static"},
            "affinity": False,
            **config,
        }
        router = TestServer(
            create_app(RouterConfig.model_validate(cfg)),
            host="127.0.0.1",
            handler_cancellation=True,
        )
        client: TestClient[Any, Any] = TestClient(router)
        await client.start_server()
        w = World(fabric, specs["prefill"], specs["decode"], client, servers)
        made.append(w)
        return w

    yield make
    for w in made:
        await w.client.close()
        for server in w.servers:
            await server.close()
