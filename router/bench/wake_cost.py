"""What a wake-up from idle costs a Python event loop on this machine: `make bench-wake`.

Why: the router benchmark's CPU per turn at one conversation is well above the same turn's at
64 conversations (a plain turn 0.64 against 0.36 ms, a streamed one with D's chunks paced 1 ms
apart 2.4 against 0.75, on a 2-core VM), and what differs between the rows is how often the
router's event loop went to sleep and was woken (its `router wakes/turn` column): about 3
times per plain turn at one conversation, 19 per paced streamed turn, almost never at 64.
This measures the machine's part of that price with no router code, so that the router's own
cost per turn can be told from the machine's.

Two processes, placed as in the router benchmark: an echo server (an `asyncio.Protocol` that
writes back what it reads; uvloop when installed, as the router) alone on the first CPU, and
this load generator on the others. N connections each send a 200-byte message and wait for its
echo before sending the next (ping-pong): at N = 1 the server sleeps between every two
messages, at N = 64 it finds the next one already in. Per message: the server's CPU (user +
system) and its wake-ups (voluntary context switches), as `bench_procs` reads them for the
router. `--kib` makes the server read that much memory per message (a byte of every cache
line), to show whether a wake-up's price grows with the data a process touches after it.

The last column divides the extra CPU per message of a row over the busiest row (N = 64) by
its extra wake-ups per message: the CPU one wake-up costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass

from bench_procs import cpu_seconds, spawn, use_uvloop, wakes
from router_testing import free_port, wait_port

MESSAGE = b"x" * 200
CONNECTIONS = (1, 4, 64)
"""Rows of a group: connections, each ping-ponging one message at a time."""
MIN_WAKE_GAP = 0.5
"""Fewer extra wake-ups per message than this over the busiest row: no slope is given."""


@dataclass(frozen=True)
class Row:
    """One level: what the server used while echoing `messages` messages."""

    kib: int
    connections: int
    messages: int
    seconds: float
    cpu_s: float
    wakes: int

    @property
    def cpu_per_message(self) -> float:
        return self.cpu_s / self.messages

    @property
    def wakes_per_message(self) -> float:
        return self.wakes / self.messages


def wake_cost(row: Row, busiest: Row) -> float | None:
    """CPU seconds per wake-up: the slope from `busiest` to `row` (None: too few extra wakes)."""
    extra_wakes = row.wakes_per_message - busiest.wakes_per_message
    if extra_wakes < MIN_WAKE_GAP:
        return None
    return (row.cpu_per_message - busiest.cpu_per_message) / extra_wakes


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


async def _serve(port: int, kib: int) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: _Echo(kib), "127.0.0.1", port)
    await asyncio.Event().wait()


class _Pinger(asyncio.Protocol):
    """One connection: sends a message, waits for all of it to come back."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.got = 0
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= len(MESSAGE) and self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def ping(self) -> None:
        assert self.transport is not None
        self.got = 0
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(MESSAGE)
        await self.done


async def _level(port: int, pid: int, kib: int, connections: int, seconds: float) -> Row:
    """`seconds` of ping-pong on `connections` connections, and what the server used."""
    loop = asyncio.get_running_loop()
    pingers = []
    for _ in range(connections):
        _, proto = await loop.create_connection(_Pinger, "127.0.0.1", port)
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
    row = Row(kib, connections, count, elapsed, cpu_seconds(pid) - cpu, wakes(pid) - woken)
    for p in pingers:
        assert p.transport is not None
        p.transport.close()
    return row


def measure(kib: int, seconds: float, server_cpus: list[int] | None) -> list[Row]:
    """One row per `CONNECTIONS` level, against an echo server reading `kib` KiB per message
    and pinned to `server_cpus`."""
    port = free_port()
    server = spawn(["-m", "wake_cost", "--serve", str(port), str(kib)], server_cpus)
    try:
        if not wait_port(port, 30.0):
            raise RuntimeError(f"the echo server did not listen on {port}")
        return [asyncio.run(_level(port, server.pid, kib, n, seconds)) for n in CONNECTIONS]
    finally:
        server.terminate()
        server.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    """Print the table: a group of rows per `--kib` value."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="per row")
    ap.add_argument(
        "--kib",
        type=int,
        nargs="*",
        default=[0, 256],
        help="KiB the server reads per message (a group of rows each)",
    )
    ap.add_argument("--serve", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    loop_name = use_uvloop()
    if args.serve:
        asyncio.run(_serve(*args.serve))
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error("needs 2 CPUs: the server alone on one, as the router in router_bench")
    os.sched_setaffinity(0, cpus[1:])
    print(f"echo server ({loop_name}) alone on CPU {cpus[0]}, load generator on the others")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(
        "| KiB read/message | connections | messages/s | server CPU µs/message "
        "| server wakes/message | CPU µs per wake (slope to 64 connections) |\n" + "|---" * 6 + "|"
    )
    for kib in args.kib:
        rows = measure(kib, args.seconds, cpus[:1])
        for row in rows:
            cost = wake_cost(row, rows[-1])
            print(
                f"| {kib} | {row.connections} | {row.messages / row.seconds:.0f} "
                f"| {row.cpu_per_message * 1e6:.1f} | {row.wakes_per_message:.2f} "
                f"| {'-' if cost is None else f'{cost * 1e6:.0f}'} |"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
