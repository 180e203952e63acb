"""The engine-call facade: whichever HTTP client is behind it, every failure of a call or of a
streamed body is one UpstreamError whose kind says whether another engine may answer and
whether this one may have seen the request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from router_testing import free_port, hang_up, raw_server, silent, trickle

from boomerang.router.engines.upstream import (
    EngineClient,
    Limits,
    UpstreamError,
    get_json,
    open_stream,
    post_json,
)

LIMITS = Limits(total=5.0, connect=2.0)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def engines() -> AsyncIterator[EngineClient]:
    client = EngineClient({"Authorization": "Bearer k"})
    yield client
    await client.close()


async def app_server(app: web.Application) -> tuple[TestServer, str]:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, f"http://127.0.0.1:{server.port}"


async def test_a_json_call_sends_the_request_id_and_the_engine_key(engines: EngineClient) -> None:
    async def echo(request: web.Request) -> web.Response:
        body = await request.json()
        headers = {k: request.headers.get(k) for k in ("Authorization", "X-Request-Id")}
        return web.json_response({"body": body, "headers": headers})

    app = web.Application()
    app.router.add_post("/v1", echo)
    server, url = await app_server(app)
    try:
        data = await post_json(engines, url + "/v1", {"a": 1}, LIMITS, "rid-p1")
        assert data == {
            "body": {"a": 1},
            "headers": {"Authorization": "Bearer k", "X-Request-Id": "rid-p1"},
        }
    finally:
        await server.close()


async def test_nothing_listening_was_never_delivered(engines: EngineClient) -> None:
    with pytest.raises(UpstreamError) as err:
        await get_json(engines, f"http://127.0.0.1:{free_port()}/health", LIMITS)
    assert err.value.kind == "connect" and not err.value.delivered and err.value.retryable


async def test_a_connection_closed_before_the_answer_may_have_been_delivered(
    engines: EngineClient,
) -> None:
    server, url = await raw_server(hang_up)
    try:
        with pytest.raises(UpstreamError) as err:
            await post_json(engines, url + "/v1", {}, LIMITS)
        assert err.value.kind == "protocol" and err.value.delivered
    finally:
        server.close()


async def test_a_silent_engine_is_a_timeout(engines: EngineClient) -> None:
    server, url = await raw_server(silent)
    try:
        with pytest.raises(UpstreamError) as err:
            await post_json(engines, url + "/v1", {}, Limits(total=0.3, connect=1.0))
        assert err.value.kind == "timeout"
        with pytest.raises(UpstreamError) as err:
            await open_stream(engines, url + "/v1", {}, LIMITS, 0.3)
        assert err.value.kind == "timeout"
    finally:
        server.close()


@pytest.mark.parametrize(("status", "kind"), [(400, "client"), (429, "status"), (503, "status")])
async def test_a_status_says_whose_fault_it_is(
    engines: EngineClient, status: int, kind: str
) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no"}}, status=status)

    app = web.Application()
    app.router.add_post("/v1", refuse)
    server, url = await app_server(app)
    try:
        for call in (
            post_json(engines, url + "/v1", {}, LIMITS),
            open_stream(engines, url + "/v1", {}, LIMITS, 1.0),
        ):
            with pytest.raises(UpstreamError) as err:
                await call
            assert (err.value.kind, err.value.status) == (kind, status)
            assert err.value.body == b'{"error": {"message": "no"}}'
    finally:
        await server.close()


async def test_a_stream_that_breaks_midway_raises_an_upstream_error(engines: EngineClient) -> None:
    async def breaks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()  # the engine goes away before the last chunk

    server, url = await raw_server(breaks)
    try:
        resp = await open_stream(engines, url + "/v1", {}, LIMITS, 1.0)
        got = []
        with pytest.raises(UpstreamError) as err:
            async for chunk in resp.iter_any():
                got.append(chunk)
        resp.release()
        assert b"".join(got).startswith(b"hello") and err.value.kind == "protocol"
    finally:
        server.close()


async def test_a_stream_past_its_total_limit_is_a_timeout(engines: EngineClient) -> None:
    server, url = await raw_server(trickle)
    try:
        resp = await open_stream(engines, url + "/v1", {}, Limits(total=0.3, connect=1.0), 1.0)
        with pytest.raises(UpstreamError) as err:
            async for _ in resp.iter_any():
                pass
        resp.release()
        assert err.value.kind == "timeout"
    finally:
        server.close()
