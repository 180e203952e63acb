"""Reading an Adaptive router's learned state: over real HTTP (an aiohttp server standing in
for the router), and the poll that turns it into status, failing quietly."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from test_operator_tuning import STATE
from test_reconcile import NOW, MemoryKube, body

from boomerang.facts import state as router_state
from boomerang.operator import handlers, routerstate
from boomerang.operator.reconcile import StatusGate, reconcile

Server = Any  # pytest-aiohttp's aiohttp_server factory


def _app(answer: Any = None, status: int = 200, text: str | None = None) -> web.Application:
    async def state(request: web.Request) -> web.Response:
        assert "Authorization" not in request.headers  # the state needs no API key
        if text is not None:
            return web.Response(text=text, status=status)
        return web.json_response(STATE if answer is None else answer, status=status)

    app = web.Application()
    app.router.add_get(router_state.PATH, state)
    return app


def _url(server: TestServer) -> str:
    return str(server.make_url(router_state.PATH))


async def test_the_state_is_read_over_http(aiohttp_server: Server) -> None:
    server = await aiohttp_server(_app())
    assert await routerstate.fetch_state(_url(server)) == STATE


@pytest.mark.parametrize(
    ("app", "why"),
    [
        (lambda: _app(status=503), "HTTP 503"),
        (lambda: _app(text="<html>not json</html>"), "JSONDecodeError"),
    ],
    ids=["unavailable", "not-json"],
)
async def test_a_router_that_answers_badly_is_unavailable(
    aiohttp_server: Server, app: Any, why: str
) -> None:
    server = await aiohttp_server(app())
    with pytest.raises(routerstate.StateUnavailable, match=why):
        await routerstate.fetch_state(_url(server))


async def test_a_router_that_does_not_answer_in_time_is_unavailable(
    aiohttp_server: Server,
) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response(STATE)

    app = web.Application()
    app.router.add_get(router_state.PATH, slow)
    server = await aiohttp_server(app)
    with pytest.raises(routerstate.StateUnavailable, match="Timeout"):
        await routerstate.fetch_state(_url(server), timeout_s=0.2)


async def test_nothing_listening_is_unavailable(unused_tcp_port: int) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}{router_state.PATH}"
    with pytest.raises(routerstate.StateUnavailable):
        await routerstate.fetch_state(url)


def _adaptive() -> dict[str, Any]:
    data = body()
    data["spec"]["kvTransfer"] = {"tuning": {"mode": "Adaptive"}}
    return data


class _Router:
    """A fetch double: records the URLs asked, answers `state` or fails."""

    def __init__(self, state: Any = STATE) -> None:
        self.state, self.urls = state, []

    async def __call__(self, url: str) -> Any:
        self.urls.append(url)
        if isinstance(self.state, Exception):
            raise self.state
        return copy.deepcopy(self.state)


async def test_a_poll_asks_the_router_service_and_writes_what_it_learned() -> None:
    kube = MemoryKube(_adaptive())
    gate = StatusGate()
    reconcile(kube.owner, kube, NOW, gate)
    router = _Router()
    outcome = await routerstate.Poller(router).poll(kube.owner, kube, lambda: NOW, gate)
    assert router.urls == ["http://minimal-router.team-a.svc:80/boomerang/v1/state"]
    assert outcome is not None and outcome.written
    assert kube.owner["status"]["kvTransfer"]["breakEvenTokens"] == 912


async def test_a_static_deployment_is_never_polled() -> None:
    data = body()
    data["spec"].setdefault("kvTransfer", {})["tuning"] = {"mode": "Static"}
    kube = MemoryKube(data)
    router = _Router()
    poller = routerstate.Poller(router)
    assert await poller.poll(kube.owner, kube, lambda: NOW, StatusGate()) is None
    assert router.urls == []


async def test_an_unreachable_router_keeps_the_last_values_and_degrades_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = MemoryKube(_adaptive())
    kube.ready = True
    gate = StatusGate()
    reconcile(kube.owner, kube, NOW, gate)
    router = _Router()
    poller = routerstate.Poller(router)
    await poller.poll(kube.owner, kube, lambda: NOW, gate)
    before, writes = copy.deepcopy(kube.owner["status"]), len(kube.status_writes)
    router.state = routerstate.StateUnavailable("HTTP 503")
    with caplog.at_level(logging.INFO, logger=routerstate.__name__):
        for _ in range(3):
            assert await poller.poll(kube.owner, kube, lambda: NOW, gate) is None
        assert not reconcile(kube.owner, kube, NOW, gate).written
        router.state = STATE
        await poller.poll(kube.owner, kube, lambda: NOW, gate)
    assert kube.owner["status"] == before and len(kube.status_writes) == writes
    degraded = next(c for c in before["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"
    failures = [r for r in caplog.records if "Failed to read router state" in r.message]
    assert len(failures) == 1  # once per outage, not every poll
    assert any("Read router state" in r.message for r in caplog.records)


async def test_a_router_not_yet_adaptive_writes_nothing() -> None:
    kube = MemoryKube(_adaptive())
    gate = StatusGate()
    reconcile(kube.owner, kube, NOW, gate)
    poller = routerstate.Poller(_Router({"mode": "static"}))
    assert await poller.poll(kube.owner, kube, lambda: NOW, gate) is None


def test_the_timer_runs_for_adaptive_resources_only() -> None:
    assert handlers._adaptive(spec={"kvTransfer": {"tuning": {"mode": "Adaptive"}}})
    assert not handlers._adaptive(spec={"kvTransfer": {"tuning": {"mode": "Static"}}})
    assert handlers._adaptive(spec={})  # the default
