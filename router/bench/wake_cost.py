"""What a wake-up from idle costs a Python server on this machine: `make bench-wake`.

Why: the router benchmark's CPU per turn at one conversation is well above the same turn's at
64 conversations (a plain turn 0.64 against 0.36 ms, a streamed one with D's chunks paced 1 ms
apart 2.4 against 0.75, on a 2-core VM), and what differs between the rows is how often the
router's event loop went to sleep and was woken (its `router wakes/turn` column): about 3
times per plain turn at one conversation, 19 per paced streamed turn, almost never at 64.
This measures that price with no router code: for a bare event loop, and for aiohttp (the
router's server) alone, so that the router's own cost per turn can be told from the machine's.

Two processes, placed as in the router benchmark: a server (uvloop when installed, as the
router) alone on the first CPU, and this load generator on the others. N connections each send
a request and wait for its answer before sending the next (ping-pong): at N = 1 the server
sleeps between every two requests, at N = 64 it finds the next one already in. Per request:
the server's CPU (user + system) and its wake-ups (voluntary context switches), as
`bench_procs` reads them for the router. The servers (a group of rows each, `--servers`):
- `echo`: an `asyncio.Protocol` that writes back the 200 bytes it reads, nothing else;
- `echo-256k`: the same, reading 256 KiB of memory per request (a byte of every cache line),
  to show whether the data a process touches after a wake-up makes the wake-up dearer;
- `aiohttp`: an aiohttp app (as the router's server) answering a small JSON POST with JSON,
  to show whether the code it runs after a wake-up does.

The last column divides a row's extra CPU per request over the busiest row (N = 64) by its
extra wake-ups per request: the CPU one wake-up costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass

import orjson
from aiohttp import web
from bench_procs import cpu_seconds, spawn, use_uvloop, wakes
from router_testing import free_port, wait_port

MESSAGE = b"x" * 200
CONNECTIONS = (1, 4, 64)
"""Rows of a group: connections, each ping-ponging one request at a time."""
MIN_WAKE_GAP = 0.5
"""Fewer extra wake-ups per request than this over the busiest row: no slope is given."""
SERVERS = ("echo", "echo-256k", "aiohttp")
_JSON = b'{"model":"m","messages":[{"role":"user","content":"' + b"hello " * 20 + b'"}]}'
HTTP_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(_JSON), _JSON)
)


@dataclass(frozen=True)
class Row:
    """One level: what the server used while answering `requests` requests."""

    server: str
    connections: int
    requests: int
    seconds: float
    cpu_s: float
    wakes: int

    @property
    def cpu_per_request(self) -> float:
        return self.cpu_s / self.requests

    @property
    def wakes_per_request(self) -> float:
        return self.wakes / self.requests


def wake_cost(row: Row, busiest: Row) -> float | None:
    """CPU seconds per wake-up: the slope from `busiest` to `row` (None: too few extra wakes)."""
    extra_wakes = row.wakes_per_request - busiest.wakes_per_request
    if extra_wakes < MIN_WAKE_GAP:
        return None
    return (row.cpu_per_request - busiest.cpu_per_request) / extra_wakes


class _Echo(asyncio.Protocol):
    def __init__(self, kib: int) -> None:
        self.memory = bytes(kib << 10)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.memory[::64]  # a byte of every cache line (a copy of 1/64 of it)
        assert self.transport is not None
        self.transport.write(data)


async def _answer(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    return web.json_response({"messages": len(body["messages"])}, dumps=_dumps)


def _dumps(obj: object) -> str:
    return orjson.dumps(obj).decode()


async def _serve(port: int, server: str) -> None:
    if server == "aiohttp":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", _answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    else:
        kib = 256 if server == "echo-256k" else 0
        await asyncio.get_running_loop().create_server(lambda: _Echo(kib), "127.0.0.1", port)
    await asyncio.Event().wait()


class _Pinger(asyncio.Protocol):
    """One connection: sends a request, waits for all of its answer (the echo, or an HTTP
    response with a Content-Length)."""

    def __init__(self, http: bool) -> None:
        self.request = HTTP_REQUEST if http else MESSAGE
        self.http = http
        self.transport: asyncio.Transport | None = None
        self.got = b""
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got += data
        if self._complete() and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _complete(self) -> bool:
        if not self.http:
            return len(self.got) >= len(MESSAGE)
        head, sep, body = self.got.partition(b"\r\n\r\n")
        if not sep:
            return False
        length = head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0]
        return len(body) >= int(length)

    async def ping(self) -> None:
        assert self.transport is not None
        self.got = b""
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(self.request)
        await self.done


async def _level(port: int, pid: int, server: str, connections: int, seconds: float) -> Row:
    """`seconds` of ping-pong on `connections` connections, and what the server used."""
    loop = asyncio.get_running_loop()
    pingers = []
    for _ in range(connections):
        _, proto = await loop.create_connection(
            lambda: _Pinger(server == "aiohttp"), "127.0.0.1", port
        )
        pingers.append(proto)
    for p in pingers:  # warm: every connection has echoed once
        await p.ping()
    count = 0
    cpu, woken = cpu_seconds(pid), wakes(pid)
    start = time.perf_counter()
    deadline = start + seconds

    async def run(p: _Pinger) -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await p.ping()
            count += 1

    await asyncio.gather(*(run(p) for p in pingers))
    elapsed = time.perf_counter() - start
    row = Row(server, connections, count, elapsed, cpu_seconds(pid) - cpu, wakes(pid) - woken)
    for p in pingers:
        assert p.transport is not None
        p.transport.close()
    return row


def measure(server: str, seconds: float, server_cpus: list[int] | None) -> list[Row]:
    """One row per `CONNECTIONS` level, against `server` (one of `SERVERS`) pinned to
    `server_cpus`."""
    port = free_port()
    proc = spawn(["-m", "wake_cost", "--serve", str(port), server], server_cpus)
    try:
        if not wait_port(port, 30.0):
            raise RuntimeError(f"the {server} server did not listen on {port}")
        return [asyncio.run(_level(port, proc.pid, server, n, seconds)) for n in CONNECTIONS]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    """Print the table: a group of rows per server."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="per row")
    ap.add_argument(
        "--servers", nargs="*", choices=SERVERS, default=list(SERVERS), help="a group each"
    )
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    loop_name = use_uvloop()
    if args.serve:
        asyncio.run(_serve(int(args.serve[0]), args.serve[1]))
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error("needs 2 CPUs: the server alone on one, as the router in router_bench")
    os.sched_setaffinity(0, cpus[1:])
    print(f"server ({loop_name}) alone on CPU {cpus[0]}, load generator on the others")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(
        "| server | connections | requests/s | server CPU µs/request | server wakes/request "
        "| CPU µs per wake (slope to 64 connections) |\n" + "|---" * 6 + "|"
    )
    for server in args.servers:
        rows = measure(server, args.seconds, cpus[:1])
        for row in rows:
            cost = wake_cost(row, rows[-1])
            print(
                f"| {server} | {row.connections} | {row.requests / row.seconds:.0f} "
                f"| {row.cpu_per_request * 1e6:.1f} | {row.wakes_per_request:.2f} "
                f"| {'-' if cost is None else f'{cost * 1e6:.0f}'} |"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
