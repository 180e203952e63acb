"""The lease API of Boomerang's vLLM plugin, on the fake decode engine.

Why it exists: the router releases and renews D's retained blocks through D's lease API
(`boomerang.connector.plugin.leases`: the real one runs inside vLLM). This fake keeps its contract:
`GET /boomerang/v1/leases`, `POST .../release` and `.../renew` with `{"request_ids": [...]}`,
bearer-token auth (401 wrong or missing, 403 when the engine has no token), JSON errors, and
the effect on the shared fake fabric: a released request's blocks are gone (a later read of
them is a violation, as a read of reused blocks would be wrong KV on a real engine), a renewed
one's deadline moves later, never earlier. `POST .../claim` answers which leases D still holds
(`held`, recorded in `spec.claimed`) and which are `gone` (a lease that yielded to pressure is
simply no longer on the fabric: `yield_lease` does that), `POST .../unclaim` records the ids in
`spec.unclaimed`. Knobs on `EngineSpec`: `lease_token`, `lease_api`
(False: no plugin, 404), `lease_status` (answer every lease call with this status).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from boomerang.facts.engine import LEASE_PATH


def add_routes(app: web.Application, spec: Any) -> None:
    """Serve the lease API for `spec` (an `EngineSpec`) unless it has no plugin."""
    if not spec.lease_api:
        return
    api = _LeaseApi(spec)
    app.router.add_get(LEASE_PATH, api.held)
    app.router.add_post(f"{LEASE_PATH}/release", api.release)
    app.router.add_post(f"{LEASE_PATH}/renew", api.renew)
    app.router.add_post(f"{LEASE_PATH}/claim", api.claim)
    app.router.add_post(f"{LEASE_PATH}/unclaim", api.unclaim)


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind}}
    return web.json_response(body, status=status)


class _LeaseApi:
    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def _refused(self, request: web.Request) -> web.Response | None:
        spec = self.spec
        spec.lease_calls.append(request.path.rsplit("/", 1)[-1])
        if spec.lease_status is not None:
            return _error(spec.lease_status, "forced failure", "server_error")
        if spec.lease_token is None:
            return _error(403, "lease control is off", "forbidden")
        if request.headers.get("Authorization") != f"Bearer {spec.lease_token}":
            return _error(401, "missing or wrong bearer token", "unauthorized")
        return None

    def _mine(self) -> dict[str, Any]:
        held = self.spec.fabric.held
        return {rid: h for (engine, rid), h in held.items() if engine == self.spec.engine_id}

    async def held(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = {"held": len(self._mine()), "ceiling_s": self.spec.decoder_ttl_s, "vllm": "fake"}
        return web.json_response(body)

    async def _ids(self, request: web.Request) -> tuple[list[str], Any]:
        data = json.loads(await request.read())
        ids = data.get("request_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise web.HTTPBadRequest(text="request_ids must be a list of strings")
        return ids, data.get("seconds")

    async def release(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        ids, _ = await self._ids(request)
        held, released, unknown = self.spec.fabric.held, [], []
        for rid in ids:
            if held.pop((self.spec.engine_id, rid), None) is None:
                unknown.append(rid)
            else:
                released.append(rid)
        self.spec.released.extend(released)
        return web.json_response({"released": released, "unknown": unknown})

    async def renew(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        ids, seconds = await self._ids(request)
        ceiling = self.spec.decoder_ttl_s
        span = ceiling if seconds is None else min(float(seconds), ceiling)
        mine, now = self._mine(), time.perf_counter()
        renewed: dict[str, float] = {}
        for rid in ids:
            if rid in mine:
                mine[rid].expires_at = renewed[rid] = max(mine[rid].expires_at, now + span)
        self.spec.renewed.extend(renewed)
        unknown = [rid for rid in ids if rid not in renewed]
        return web.json_response({"renewed": renewed, "unknown": unknown, "ceiling_s": ceiling})

    async def claim(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        ids, _ = await self._ids(request)
        mine = self._mine()
        held = [rid for rid in ids if rid in mine]
        self.spec.claimed.extend(held)  # D holds them from here, whether or not it answers
        await asyncio.sleep(self.spec.claim_answer_s)
        return web.json_response({"held": held, "gone": [r for r in ids if r not in held]})

    async def unclaim(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        ids, _ = await self._ids(request)
        self.spec.unclaimed.extend(ids)
        return web.json_response({"unclaimed": ids})


def yield_lease(spec: Any) -> list[str]:
    """What a real D does under memory pressure: every lease of `spec`'s engine not claimed
    yields (its blocks are gone from the fabric: reading them is a violation)."""
    held = spec.fabric.held
    gone = [
        rid for (engine, rid) in list(held) if engine == spec.engine_id and rid not in spec.claimed
    ]
    for rid in gone:
        del held[(spec.engine_id, rid)]
    return gone
