"""The engine HTTP client against real servers: aiohttp apps, and raw sockets for misbehaviour.

What the flow depends on is asserted directly: keep-alive reuse, no reuse of stale or closed
connections, ConnectError only when the engine cannot have seen the request, a timed-out or
aborted call drops its connection (so the engine sees the client go), and streams arrive in
pieces, with back-pressure, within their time limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from router_testing import free_port, hang_up, raw_server, silent, trickle

from boomerang.router.engines.engine_http import ConnectError, HttpClient, HttpError, Limits

LIMITS = Limits(total=5.0, connect=2.0)


@pytest.fixture
async def engines() -> AsyncIterator[HttpClient]:
    client = HttpClient({"Authorization": "Bearer k"})
    yield client
    await client.close()


async def _serve(app: web.Application) -> tuple[TestServer, str]:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, f"http://127.0.0.1:{server.port}"


async def _echo_app(peers: list[Any]) -> tuple[TestServer, str]:
    async def echo(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        body = await request.read()
        return web.json_response(
            {"body": body.decode(), "auth": request.headers.get("Authorization")}
        )

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    return await _serve(app)


async def test_sequential_calls_share_one_kept_alive_connection(engines: HttpClient) -> None:
    peers: list[Any] = []
    server, url = await _echo_app(peers)
    try:
        for i in range(3):
            status, body = await engines.request("POST", url + "/echo", b'{"i":%d}' % i, LIMITS)
            assert status == 200
            assert body == b'{"body": "{\\"i\\":%d}", "auth": "Bearer k"}' % i
        assert len(peers) == 3 and len(set(peers)) == 1
    finally:
        await server.close()


async def test_concurrent_calls_each_get_a_connection_and_their_own_answer(
    engines: HttpClient,
) -> None:
    peers: list[Any] = []
    server, url = await _echo_app(peers)
    try:
        bodies = [b"call-%d" % i for i in range(20)]
        answers = await asyncio.gather(
            *(engines.request("POST", url + "/echo", b, LIMITS) for b in bodies)
        )
        for body, (status, answer) in zip(bodies, answers, strict=True):
            assert status == 200 and json.loads(answer)["body"] == body.decode()
        await engines.request("GET", url + "/echo", None, LIMITS)
        assert len(set(peers)) <= 20  # the last call reused one of the pooled connections
    finally:
        await server.close()


async def test_connections_idle_past_idle_s_are_not_reused() -> None:
    peers: list[Any] = []
    server, url = await _echo_app(peers)
    engines = HttpClient(idle_s=0.05)
    try:
        await engines.request("GET", url + "/echo", None, LIMITS)
        await asyncio.sleep(0.15)
        await engines.request("GET", url + "/echo", None, LIMITS)
        assert len(set(peers)) == 2
    finally:
        await engines.close()
        await server.close()


async def test_nothing_listening_is_a_connect_error(engines: HttpClient) -> None:
    port = free_port()
    with pytest.raises(ConnectError):
        await engines.request("GET", f"http://127.0.0.1:{port}/x", None, LIMITS)


async def test_a_connection_closed_before_the_answer_is_not_a_connect_error(
    engines: HttpClient,
) -> None:
    server, url = await raw_server(hang_up)
    try:
        with pytest.raises(HttpError) as err:
            await engines.request("POST", url + "/v1", b"{}", LIMITS)
        assert not isinstance(err.value, ConnectError)  # the engine may have seen it
    finally:
        server.close()


async def test_a_malformed_answer_is_an_http_error(engines: HttpClient) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()

    server, url = await raw_server(garbage)
    try:
        with pytest.raises(HttpError):
            await engines.request("GET", url + "/", None, LIMITS)
    finally:
        server.close()


async def test_a_server_that_closes_after_answering_gets_a_fresh_connection(
    engines: HttpClient,
) -> None:
    accepted = 0

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # no Connection: close header: the client must notice the EOF itself

    server, url = await raw_server(once)
    try:
        for _ in range(3):
            assert await engines.request("GET", url + "/", None, LIMITS) == (200, b"ok")
            await asyncio.sleep(0.05)  # the EOF arrives
        assert accepted == 3
    finally:
        server.close()


def _answer_then_await_eof(
    answer: bytes,
) -> tuple[Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], asyncio.Event]:
    """A raw handler that reads the request, writes `answer`, then waits for the client to
    drop the connection; the event is set when it did."""
    saw_eof = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answer:
            writer.write(answer)
            await writer.drain()
        await reader.read()  # returns at EOF: the client dropped the connection
        saw_eof.set()

    return handler, saw_eof


async def test_a_timed_out_call_drops_its_connection(engines: HttpClient) -> None:
    silent, saw_eof = _answer_then_await_eof(b"")
    server, url = await raw_server(silent)
    try:
        with pytest.raises(TimeoutError):
            await engines.request("GET", url + "/", None, Limits(total=0.2, connect=1.0))
        await asyncio.wait_for(saw_eof.wait(), 2.0)
    finally:
        server.close()


async def test_a_cancelled_stream_drops_its_connection(engines: HttpClient) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    endless, saw_eof = _answer_then_await_eof(head)
    server, url = await raw_server(endless)
    try:
        resp = await engines.stream("POST", url + "/", b"{}", LIMITS, headers_s=1.0)
        assert await anext(resp.iter_any()) == b"hello"
        resp.close()
        await asyncio.wait_for(saw_eof.wait(), 2.0)
    finally:
        server.close()


async def test_a_stream_arrives_in_pieces_then_the_connection_is_reused(
    engines: HttpClient,
) -> None:
    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(3):
            await resp.write(b"data: %d\n\n" % i)
            await asyncio.sleep(0.02)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/s", events)
    server, url = await _serve(app)
    try:
        resp = await engines.stream("POST", url + "/s", b"{}", LIMITS, headers_s=1.0)
        pieces = [chunk async for chunk in resp.iter_any()]
        resp.release()
        assert b"".join(pieces) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert len(pieces) >= 2  # delivered as they came, not buffered to the end
        assert await engines.request("POST", url + "/s", b"{}", LIMITS) == (200, b"".join(pieces))
    finally:
        await server.close()


class Callbacks:
    """What a diverted body gave its callbacks."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.ends: list[BaseException | None] = []
        self.ended = asyncio.Event()

    def on_data(self, data: bytes) -> None:
        self.pieces.append(data)

    def on_end(self, exc: BaseException | None) -> None:
        self.ends.append(exc)
        self.ended.set()


async def test_a_diverted_stream_goes_to_callbacks_read_by_read_then_the_connection_is_reused(
    engines: HttpClient,
) -> None:
    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(4):
            await resp.write(b"data: %d\n\n" % i)
            await asyncio.sleep(0.02)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/s", events)
    server, url = await _serve(app)
    try:
        resp = await engines.stream("POST", url + "/s", b"{}", LIMITS, headers_s=1.0)
        first = await anext(resp.iter_any())  # read by a task first, then diverted
        got = Callbacks()
        resp.divert(got.on_data, got.on_end)
        await asyncio.wait_for(got.ended.wait(), 2.0)
        resp.release()
        assert first + b"".join(got.pieces) == b"".join(b"data: %d\n\n" % i for i in range(4))
        assert len(got.pieces) >= 2 and b"" not in got.pieces  # as they came, one per read
        assert got.ends == [None]
        assert await engines.request("POST", url + "/s", b"{}", LIMITS) == (
            200,
            first + b"".join(got.pieces),
        )
    finally:
        await server.close()


async def test_a_diverted_stream_past_its_limit_or_cut_off_ends_with_the_failure(
    engines: HttpClient,
) -> None:
    server, url = await raw_server(trickle)
    try:
        limits = Limits(total=0.3, connect=1.0)
        resp = await engines.stream("POST", url + "/", b"{}", limits, headers_s=1.0)
        got = Callbacks()
        resp.divert(got.on_data, got.on_end)
        await asyncio.wait_for(got.ended.wait(), 2.0)
        resp.release()
        assert len(got.ends) == 1 and isinstance(got.ends[0], TimeoutError)
        assert set(b"".join(got.pieces)) == {ord("x")}
    finally:
        server.close()
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"

    async def cut_off(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head)
        await writer.drain()
        writer.close()  # mid-body

    server, url = await raw_server(cut_off)
    try:
        resp = await engines.stream("POST", url + "/", b"{}", LIMITS, headers_s=1.0)
        got = Callbacks()
        resp.divert(got.on_data, got.on_end)
        await asyncio.wait_for(got.ended.wait(), 2.0)
        resp.release()
        assert b"".join(got.pieces) == b"hello"
        assert len(got.ends) == 1 and isinstance(got.ends[0], HttpError)
    finally:
        server.close()


async def test_a_body_larger_than_the_read_buffer_arrives_whole_to_a_slow_reader(
    engines: HttpClient,
) -> None:
    blob = bytes(range(256)) * (12 * 1024)  # 3 MiB, past the 1 MiB high-water mark

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=blob)

    app = web.Application()
    app.router.add_get("/big", big)
    server, url = await _serve(app)
    try:
        resp = await engines.stream("GET", url + "/big", None, LIMITS, headers_s=1.0)
        got = bytearray()
        async for chunk in resp.iter_any():
            got += chunk
            await asyncio.sleep(0)  # a slow consumer: the client pauses and resumes reading
        resp.release()
        assert bytes(got) == blob
    finally:
        await server.close()


async def test_a_stream_past_its_total_limit_fails_its_reader(engines: HttpClient) -> None:
    server, url = await raw_server(trickle)
    try:
        resp = await engines.stream(
            "POST", url + "/", b"{}", Limits(total=0.3, connect=1.0), headers_s=1.0
        )
        with pytest.raises(TimeoutError):
            async for _ in resp.iter_any():
                pass
        resp.release()
    finally:
        server.close()


def test_the_client_works_on_uvloop_as_deployed() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[int, bytes]:
        peers: list[Any] = []
        server, url = await _echo_app(peers)
        engines = HttpClient()
        try:
            await engines.request("POST", url + "/echo", b"1", LIMITS)
            return await engines.request("POST", url + "/echo", b"2", LIMITS)
        finally:
            await engines.close()
            await server.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        status, body = runner.run(main())
    assert status == 200 and json.loads(body)["body"] == "2"


async def test_a_body_that_stalls_after_the_headers_times_out(engines: HttpClient) -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        await writer.drain()
        await reader.read()

    server, url = await raw_server(stall)
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await engines.request("GET", url + "/", None, Limits(total=0.3, connect=1.0))
        assert asyncio.get_running_loop().time() - started < 2.0
    finally:
        server.close()


async def test_a_stream_without_headers_in_time_times_out(engines: HttpClient) -> None:
    server, url = await raw_server(silent)
    try:
        with pytest.raises(TimeoutError):
            await engines.stream("POST", url + "/", b"{}", LIMITS, headers_s=0.2)
    finally:
        server.close()


async def test_a_body_delimited_by_the_connection_closing_arrives_whole(
    engines: HttpClient,
) -> None:
    async def old_style(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 5000)
        await writer.drain()
        writer.close()

    server, url = await raw_server(old_style)
    try:
        assert await engines.request("GET", url + "/", None, LIMITS) == (200, b"x" * 5000)
        assert await engines.request("GET", url + "/", None, LIMITS) == (200, b"x" * 5000)
    finally:
        server.close()
