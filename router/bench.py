"""Router overhead benchmark: instant fake engines on loopback, router vs calling them directly.

Run: `PYTHONSAFEPATH=1 python -m boomerang.router.bench` (about a minute on 2 cores).

Three processes: the fake P and D engines (one process), the router (`boomerang-router`, as
deployed), and this load generator. For each concurrency level, that many conversations run
their turns back to back (turn 1 misses, later turns are verified hits: tokenize + handle), once
through the router and once "direct" (the load generator itself calls P then D with the same
bodies the router would send). Added latency = router percentile - direct percentile. Memory per
stored conversation is measured in-process with tracemalloc over 100k realistic handles (a 1k
token history: 63 block ids, as vLLM's 16-token blocks give).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import aiohttp
from aiohttp import web

from boomerang.router import protocol
from boomerang.router.conversation import build_handle, id_key
from boomerang.router.store import MemoryStore
from boomerang.router.testing import EngineSpec, Fabric, FakeEngine
from boomerang.router.validation import validate

LEVELS = ((1, 8, 25), (64, 8, 1), (256, 4, 1))
"""(concurrent conversations, turns each, waves) per round: short conversations everywhere, so
the levels differ in concurrency only (a long history adds JSON work per turn, see README)."""
ROUNDS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve_engines(p_port: int, d_port: int) -> None:
    fabric = Fabric()
    for role, port in (("prefill", p_port), ("decode", d_port)):
        spec = EngineSpec(role=role, engine_id=role, fabric=fabric, reply_words=4)
        runner = web.AppRunner(FakeEngine(spec).app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    while True:
        await asyncio.sleep(3600)
        fabric.held.clear()


def _wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


async def _router_turn(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _direct_turn(
    session: aiohttp.ClientSession, p: str, d: str, body: dict[str, Any], handle: Any
) -> Any:
    req = validate("chat", body, None)
    async with session.post(
        p + "/v1/chat/completions", json=protocol.prefill_request(req.body, handle)
    ) as resp:
        params = (await resp.json())["kv_transfer_params"]
    d_body = protocol.decode_request(req.body, params, stream=False)
    async with session.post(d + "/v1/chat/completions", json=d_body) as resp:
        return await resp.json()


async def _conversation(
    session: aiohttp.ClientSession, target: dict[str, str], cid: str, turns: int, out: list[float]
) -> None:
    history = [{"role": "user", "content": f"conversation {cid} opens with a question"}]
    handle = None
    for turn in range(turns):
        body = {"model": "fake", "messages": history, "conversation_id": cid}
        start = time.perf_counter()
        if "router" in target:
            data = await _router_turn(session, target["router"], body)
        else:
            data = await _direct_turn(session, target["p"], target["d"], body, handle)
            handle = data.get("kv_transfer_params")
        out.append(time.perf_counter() - start)
        reply = data["choices"][0]["message"]
        history = [*history, reply, {"role": "user", "content": f"turn {turn} follow-up"}]


async def _level(
    target: dict[str, str], conc: int, turns: int, waves: int
) -> tuple[list[float], float]:
    """`waves` batches, one after the other, of `conc` concurrent conversations."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _conversation(session, target, "warmup", 3, [])
        start = time.perf_counter()
        for wave in range(waves):
            await asyncio.gather(
                *(
                    _conversation(session, target, f"w{wave}c{i}", turns, latencies)
                    for i in range(conc)
                )
            )
        wall = time.perf_counter() - start
    return latencies, wall


def _pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def memory_per_conversation(n: int = 100_000, scattered: bool = False) -> float:
    """Bytes per stored conversation in the memory store, for realistic handles.

    `scattered`: block ids drawn at random (a fragmented KV cache) instead of a run, which is
    the worst case for the params' compression.
    """
    rng = random.Random(0)
    store = MemoryStore(max_conversations=n)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    loop = asyncio.new_event_loop()
    for i in range(n):
        params = {
            "do_remote_prefill": False,
            "do_remote_decode": True,
            "remote_block_ids": [
                rng.sample(range(200_000), 63) if scattered else list(range(1000 + i, 1063 + i))
            ],
            "remote_engine_id": "0b5c1f9e-6d5e-4b6a-9a43-8a1f0c7d2e11",
            "remote_request_id": f"chatcmpl-{i:032x}",
            "remote_host": "10.0.12.34",
            "remote_port": 5600,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": 1000,
            "remote_blocks_expiry_time": 123456.789,
            "transfer_mode": "pull",
        }
        handle = build_handle(params, range(1000), "http://10.0.12.34:8000", time.time() + 400)
        assert handle is not None
        loop.run_until_complete(store.put(id_key("tenant", f"conversation-{i}"), handle))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    loop.close()
    return (after - before) / n


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--serve-engines", nargs=2, type=int, metavar=("P_PORT", "D_PORT"))
    args = ap.parse_args(argv)
    if args.serve_engines:
        asyncio.run(_serve_engines(*args.serve_engines))
        return
    p_port, d_port, r_port = _free_port(), _free_port(), _free_port()
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    engines = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "boomerang.router.bench",
            "--serve-engines",
            str(p_port),
            str(d_port),
        ],
        env=env,
    )
    router = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "boomerang.router",
            "--port",
            str(r_port),
            "--host",
            "127.0.0.1",
            "--prefill",
            f"http://127.0.0.1:{p_port}",
            "--decode",
            f"http://127.0.0.1:{d_port}",
            "--log-level",
            "WARNING",
        ],
        env=env,
    )
    try:
        for port in (p_port, d_port, r_port):
            _wait_port(port)
        _run_table(p_port, d_port, r_port, router.pid)
    finally:
        for proc in (router, engines):
            proc.terminate()
            proc.wait(timeout=10)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_table(p_port: int, d_port: int, r_port: int, router_pid: int) -> None:
    loc = "http://127.0.0.1:"
    direct = {"p": f"{loc}{p_port}", "d": f"{loc}{d_port}"}
    routed = {"router": f"{loc}{r_port}"}
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    print(f"{ROUNDS} alternating rounds per level; turns/s = router turns / router wall time;")
    print("router CPU ms/turn = the router process's user+system time / turns it served")
    print(
        "| conversations | turns | direct p50/p99 ms | router p50/p99 ms "
        "| added p50/p99 ms | router turns/s | router CPU ms/turn |"
    )
    print("|---|---|---|---|---|---|---|")
    for conc, turns, waves in LEVELS:
        # Alternate short rounds so both modes see the same background load (shared machine).
        d_lat, r_lat, wall, cpu = [], [], 0.0, 0.0
        for _ in range(ROUNDS):
            lat, _ = asyncio.run(_level(direct, conc, turns, waves))
            d_lat += lat
            cpu_before = _cpu_seconds(router_pid)
            lat, seconds = asyncio.run(_level(routed, conc, turns, waves))
            cpu += _cpu_seconds(router_pid) - cpu_before
            r_lat += lat
            wall += seconds
        d50, d99, r50, r99 = (_pct(d_lat, 50), _pct(d_lat, 99), _pct(r_lat, 50), _pct(r_lat, 99))
        row = [
            f"{conc}",
            f"{len(r_lat)}",
            f"{d50 * 1e3:.2f} / {d99 * 1e3:.2f}",
            f"{r50 * 1e3:.2f} / {r99 * 1e3:.2f}",
            f"{(r50 - d50) * 1e3:.2f} / {(r99 - d99) * 1e3:.2f}",
            f"{len(r_lat) / wall:.0f}",
            f"{cpu / len(r_lat) * 1e3:.2f}",
        ]
        print("| " + " | ".join(row) + " |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for scattered in (False, True):
        kind = "scattered" if scattered else "contiguous"
        per = memory_per_conversation(scattered=scattered)
        print(
            f"memory store: {per:.0f} bytes per stored conversation (100k conversations, "
            f"1k-token history, 63 {kind} block ids)"
        )


if __name__ == "__main__":
    main()
