"""Router overhead benchmark: instant fake engines on loopback, router vs calling them directly.

Run: `make bench-router [ARGS="--rate 500 --no-pin"]` (~2 min, 2 cores,
plus the memory table; `--memory-only` prints just that table, about 4 min on 2 busy cores;
`--no-memory` leaves it out, `--saturation-only` the fixed-load table too). `--stream` makes
every turn a streamed one (see below).

Three processes, on uvloop when it is installed: the fake P and D engines (testing.py's
`FakeEngine`, both in one process), the router (`boomerang-router`, as deployed) and this load
generator. With 2+ CPUs the router runs alone on the first (in production it is a pod with its own
CPU) and the engines and the load generator share the others, so the router's cost is measured
apart from the harness's; `--no-pin` lets all of them share every CPU.

A level of N conversations keeps N slots busy, each running conversations of 8 turns one after the
other (short ones: levels differ in concurrency only; a long history adds JSON work per turn, see
README). Turn 1 misses, every later turn is a verified hit (tokenize + handle); after the run the
router's reuse counts (/metrics) and the engines' fabric (P pulled the history back from D each
time, no protocol violation) are checked against the turns sent. Rounds alternate "direct" (this
process calls P then D with the bodies the router would send, handles included) and "router", so
both see the same background load; added latency = router percentile - direct percentile. The
load generator sends with the router's own engine client (engine_http.py): a direct engine call
costs it what an engine call costs the router.

Saturation: a slot sends its next turn as soon as the reply arrives (closed loop), so at 64 slots
and more latency is mostly queueing and turns/s is what the machine sustains. CPU ms/turn: a
process's user+system time (/proc) during the router rounds / router turns (the engines serve 3
requests per routed turn: tokenize, P, D). Router reads+writes/turn: the router's read and write
system calls (/proc/PID/io syscr + syscw) per routed turn: a streamed turn costs a read of D's
socket and a write to the client's per batch of events, and how many events a read brings
depends on the timing of both processes, so this column says which case a row measured. Router
wakes/turn: how often the router's event loop went to sleep and was woken (its voluntary context
switches) per routed turn. Rows with many (one conversation: the router idles between the
engines' answers; D paced: between D's events) cost more CPU per turn for that alone: about
100 µs per wake-up on the 2-core VMs this was measured on (the slope across rows), against
about 30 for a bare event loop and 50 for aiohttp alone (`wake_cost.py`). Fixed offered load: a
slot waits an exponential think time (mean N / rate, seeded: the same in both modes) before each
turn, for a fixed time per round, so about `--rate` turns/s arrive (fewer at 1 slot, whose
latency adds to its think time); the router's CPU and wake-ups per turn there are those of a
router that is busy part of the time, between the saturation rows and an idle one. Memory per
stored conversation: tracemalloc over 100k realistic handles in this process (D's params with
one block id per block and the per-block hashes), for a 1k-token history in 16-token blocks and
8k and 32k tokens in 128-token blocks (`bench_memory.CASES`).

Streamed turns (`--stream`): the client asks for `stream: true` and `max_tokens: 16`; D streams as
vLLM >= 0.33 does, one chunk per token (the first chunk carries the role and the prompt's token
ids, the last the finish reason and D's kv_transfer_params), so a turn is 18 SSE events with
`[DONE]`. The router passes D's stream through; the load generator reads it to its end (latency
is to the last byte), assembles the reply for the next turn's history and checks that no
engine-internal field reached it. Direct rounds stream from D the same way. The fake D writes
its chunks back to back; `--chunk-delay-ms` spaces them as a real D's decode steps do, so that
each event reaches the router in a read of its own (the costly case for a relay).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import os
import statistics
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson
from aiohttp import web
from bench_memory import CASES, memory_per_conversation
from bench_procs import cpu_seconds, io_calls, spawn, use_uvloop, wakes
from bench_turns import STREAM_TOKENS, conversation, think_times
from prometheus_client.parser import text_string_to_metric_families
from router_testing import EngineSpec, Fabric, FakeEngine, free_port, wait_port

from boomerang.router.engines.upstream import EngineClient

TURNS = 8
"""Turns per conversation."""
SIZES = {1: 50, 64: 2, 256: 1}
"""Concurrent conversations (slots) -> conversations per slot in a saturation round."""
ROUNDS = 3
MIN_ROUND_S = 4.0
"""A fixed-load round lasts max(this, TURNS mean think times) seconds."""


async def _serve_engines(p_port: int, d_port: int, chunk_delay_s: float = 0.0) -> None:
    """The fake P and D engines; both also answer GET /fabric (pulls, declines, violations)."""
    fabric = Fabric()

    async def report(request: web.Request) -> web.Response:
        pulls = {who: sum(1 for w, _ in fabric.pulls if w == who) for who in ("prefill", "decode")}
        body = {"pulls": pulls, "declined": fabric.declined, "violations": fabric.violations}
        return web.json_response(body)

    for role, port in (("prefill", p_port), ("decode", d_port)):
        spec = EngineSpec(
            role=role,
            engine_id=role,
            fabric=fabric,
            record_calls=False,
            version="0.33.0",  # streams D's params on the final chunk, as vLLM >= 0.33
            stream_params=True,
            chunk_per_token=True,
            chunk_delay_s=chunk_delay_s,
        )
        app = FakeEngine(spec).app()
        app.router.add_get("/fabric", report)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    gc.freeze()  # full collections skip the startup objects (harness noise, not the router's)
    await asyncio.Event().wait()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return bytes(resp.read())


@dataclass
class Mode:
    """One way of running turns ("direct" or "router") and what a row's rounds measured."""

    name: str
    urls: dict[str, str]
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    router_syscalls: int = 0
    router_wakes: int = 0


@dataclass
class Bench:
    """The running processes, and every turn and conversation sent (for the final checks)."""

    modes: tuple[Mode, Mode]
    pids: dict[str, int]
    rate: float
    stream: bool = False
    turns: dict[str, int] = field(default_factory=lambda: {"direct": 0, "router": 0})
    conversations: dict[str, int] = field(default_factory=lambda: {"direct": 0, "router": 0})
    rows: int = 0

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by each process."""
        out = {"load generator": time.process_time()}
        out |= {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        return out


async def _round(
    bench: Bench, mode: Mode, client: EngineClient, slots: int, mean_s: float, tag: str
) -> None:
    """`slots` slots, each running conversations one after the other: SIZES[slots] of them
    back to back (mean_s 0), else think times for a fixed time; tag "w": warm-up, 1 turn each."""
    count = 1 if tag == "w" else None if mean_s else SIZES[slots]
    turns = 1 if tag == "w" else TURNS
    seconds = max(MIN_ROUND_S, TURNS * mean_s) if mean_s else float("inf")
    router = bench.pids["router"]
    cpu, syscalls, woken = bench.cpu(), io_calls(router), wakes(router)
    start, out = time.perf_counter(), list[float]()

    async def slot(i: int) -> None:
        thinks, deadline = think_times(f"{tag}/{i}", mean_s), start + seconds  # same in both modes
        for k in itertools.count():
            if time.perf_counter() >= deadline or k == count:
                return
            cid = f"{mode.name}{bench.rows}.{tag}s{i}c{k}"  # unique: each conversation is new
            n = await conversation(
                client, mode.urls, cid, turns, thinks, deadline, out, bench.stream
            )
            bench.turns[mode.name] += n
            bench.conversations[mode.name] += n > 0

    await asyncio.gather(*(slot(i) for i in range(slots)))
    if tag != "w":
        mode.wall_s += time.perf_counter() - start
        mode.latencies += out
        for name, used in bench.cpu().items():
            mode.cpu_s[name] = mode.cpu_s.get(name, 0.0) + used - cpu[name]
        mode.router_syscalls += io_calls(router) - syscalls
        mode.router_wakes += wakes(router) - woken


async def _level(bench: Bench, slots: int, mean_s: float) -> tuple[Mode, Mode]:
    """Alternating direct and router rounds, each mode with a warm client (connection pool)."""
    bench.rows += 1
    modes = tuple(Mode(m.name, m.urls) for m in bench.modes)
    clients = [EngineClient(idle_s=600.0) for _ in modes]
    try:
        for mode, client in zip(modes, clients, strict=True):  # open every connection
            await _round(bench, mode, client, slots, 0.0, "w")
        for rnd in range(ROUNDS):
            for mode, client in zip(modes, clients, strict=True):
                await _round(bench, mode, client, slots, mean_s, str(rnd))
    finally:
        for client in clients:
            await client.close()
    return modes[0], modes[1]


def _pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _latency_cells(direct: Mode, routed: Mode) -> list[str]:
    """p50 / p99 ms: direct, router, added."""
    d, r = ([_pct(m.latencies, q) * 1e3 for q in (50, 99)] for m in (direct, routed))
    return [f"{p50:.2f} / {p99:.2f}" for p50, p99 in (d, r, (r[0] - d[0], r[1] - d[1]))]


def _table(bench: Bench, fixed_load: bool) -> None:
    latency = "direct p50/p99 ms | router p50/p99 ms | added p50/p99 ms"
    if fixed_load:
        print(f"\nLatency at a fixed offered load of {bench.rate:.0f} turns/s (think times)")
        print(
            f"| conversations | turns | achieved turns/s | {latency} | router CPU ms/turn "
            "| router wakes/turn |\n" + "|---" * 8 + "|"
        )
    else:
        print("\nSaturation (closed loop: a slot's next turn goes as soon as its reply is in; at")
        print("64+ conversations latency is queueing: the fixed-load table measures added latency)")
        print(
            f"| conversations | turns | {latency} | router turns/s | router CPU ms/turn "
            "| engines CPU ms/turn | load gen CPU ms/turn | router reads+writes/turn "
            "| router wakes/turn |\n" + "|---" * 11 + "|"
        )
    for slots in SIZES:
        direct, routed = asyncio.run(_level(bench, slots, slots / bench.rate if fixed_load else 0))
        n = len(routed.latencies)
        rate = f"{n / routed.wall_s:.0f}"
        cpu = {k: f"{routed.cpu_s[k] / n * 1e3:.2f}" for k in (*bench.pids, "load generator")}
        latency_cells = _latency_cells(direct, routed)
        syscalls, woken = f"{routed.router_syscalls / n:.1f}", f"{routed.router_wakes / n:.1f}"
        if fixed_load:  # the router's CPU at a partial load: between saturation and idle
            cells = [rate, *latency_cells, cpu["router"], woken]
        else:
            cells = [*latency_cells, rate, *cpu.values(), syscalls, woken]
        print(f"| {slots} | {n} | " + " | ".join(cells) + " |")


def _checks(bench: Bench) -> list[str]:
    """Print the router's reuse counts and the engines' fabric; return what went wrong."""
    reuse = {}
    page = _get(bench.modes[1].urls["router"] + "/metrics").decode()
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "boomerang_router_reuse_total":
                reuse[sample.labels["outcome"]] = int(sample.value)
    fabric = orjson.loads(_get(bench.modes[0].urls["p"] + "/fabric"))
    turns, convs = bench.turns, bench.conversations
    want = {"hit": turns["router"] - convs["router"], "miss": convs["router"]}
    want_pulls = {
        "prefill": sum(turns.values()) - sum(convs.values()),
        "decode": sum(turns.values()),
    }
    print(f"\nrouter /metrics boomerang_router_reuse_total: {reuse}")
    print(f"expected (every routed turn after a conversation's first a verified hit): {want}")
    print(
        f"engines: pulls {fabric['pulls']} (P pulling the history back from D, D pulling P's "
        f"prefill; expected {want_pulls}: direct and routed turns), {fabric['declined']} "
        f"declined, {len(fabric['violations'])} protocol violations"
    )
    problems = [f"violation: {v}" for v in fabric["violations"][:5]]
    if reuse != {**dict.fromkeys(reuse, 0), **want}:
        problems.append("the router's reuse counts are not the expected ones")
    if fabric["pulls"] != want_pulls:
        problems.append("the engines' pulls are not the expected ones")
    return problems


def _memory_table() -> None:
    """Bytes per stored conversation in the memory store, for each `bench_memory.CASES`, with
    D's block ids in one run and drawn at random (a fragmented KV cache, the worst case)."""
    print("Memory store: bytes per stored conversation (100k conversations, tracemalloc)")
    cells = ("history tokens", "block size", "block ids", "block hashes", "contiguous ids")
    print("| " + " | ".join(cells) + " | scattered ids |\n" + "|---" * 6 + "|")
    for tokens, size in CASES:
        per = [
            memory_per_conversation(scattered=s, tokens=tokens, block_size=size)
            for s in (False, True)
        ]
        blocks, hashes = -(-tokens // size), 8 * (tokens // size)
        print(f"| {tokens} | {size} | {blocks} | {hashes} B | {per[0]:.0f} | {per[1]:.0f} |")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the tables; exit 1 if the reuse or protocol checks fail."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rate", type=float, default=500.0, help="offered turns/s (fixed-load table)")
    ap.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        help="router alone on the first CPU, the rest on the others (default: with 2+ CPUs)",
    )
    ap.add_argument("--memory-only", action="store_true", help="print only the memory table")
    ap.add_argument("--no-memory", action="store_true", help="leave the memory table out")
    ap.add_argument(
        "--saturation-only", action="store_true", help="only the closed-loop (CPU) table"
    )
    ap.add_argument(
        "--stream", action="store_true", help=f"streamed turns of {STREAM_TOKENS} tokens"
    )
    ap.add_argument(
        "--chunk-delay-ms",
        type=float,
        default=0.0,
        help="with --stream: D pauses this long between chunks (as a real D's decode steps)",
    )
    ap.add_argument("--serve-engines", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_only:
        _memory_table()
        return
    loop_name = use_uvloop()
    if args.serve_engines:
        asyncio.run(_serve_engines(*args.serve_engines, args.chunk_delay_ms / 1e3))
        return
    cpus = sorted(os.sched_getaffinity(0))
    pin = len(cpus) >= 2 if args.pin is None else args.pin
    if pin and len(cpus) < 2:
        ap.error("--pin needs at least 2 CPUs")
    if pin:
        os.sched_setaffinity(0, cpus[1:])  # the load generator, and the engines it spawns
    router_cpus = cpus[:1] if pin else None
    with engines_and_router(["-m", "boomerang.router"], args.chunk_delay_ms, router_cpus) as up:
        url, pids = up
        modes = (
            Mode("direct", {"p": url["p"], "d": url["d"]}),
            Mode("router", {"router": url["r"]}),
        )
        bench = Bench(modes, pids, args.rate, args.stream)
        memory = not (args.no_memory or args.saturation_only)
        status = _run(bench, loop_name, memory, fixed_load=not args.saturation_only)
    raise SystemExit(status)


@contextlib.contextmanager
def engines_and_router(
    router_cmd: list[str], chunk_delay_ms: float = 0.0, router_cpus: list[int] | None = None
) -> Iterator[tuple[dict[str, str], dict[str, int]]]:
    """The fake P and D engines and a router in front of them (`router_cmd` starts it, given
    its flags), listening: their URLs ("p", "d", "r") and the router's and engines' pids; both
    stopped after. One place for the benchmarks that drive a router (`call_count` too)."""
    ports = [str(free_port()) for _ in range(3)]
    url = {role: f"http://127.0.0.1:{port}" for role, port in zip("pdr", ports, strict=True)}
    delay = ["--chunk-delay-ms", str(chunk_delay_ms)]
    engines = spawn(["-m", "router_bench", "--serve-engines", *ports[:2], *delay], None)
    # Static: every turn after a conversation's first is a verified pull (what is measured).
    flags = ["--host", "127.0.0.1", "--port", ports[2], "--log-level", "WARNING"]
    flags += ["--tuning-mode", "static"]
    flags += ["--prefill", url["p"], "--decode", url["d"]]
    router = spawn([*router_cmd, *flags], router_cpus)
    try:
        for port in ports:
            if not wait_port(int(port), 30.0):
                raise RuntimeError(f"nothing listens on {port}")
        yield url, {"router": router.pid, "engines": engines.pid}
    finally:
        for proc in (router, engines):
            proc.terminate()
            proc.wait(timeout=10)


def _run(bench: Bench, loop_name: str, memory: bool = True, fixed_load: bool = True) -> int:
    where = {name: os.sched_getaffinity(pid) for name, pid in bench.pids.items()}
    where["load generator"] = os.sched_getaffinity(0)
    cpus = {name: ",".join(map(str, sorted(c))) for name, c in where.items()}
    print("placement: " + "; ".join(f"{name} on CPU {c}" for name, c in cpus.items()))
    print(
        f"machine: {os.cpu_count()} CPUs; event loop of the engines and load generator: {loop_name}"
    )
    print(f"{ROUNDS} alternating direct/router rounds per row; conversations of {TURNS} turns")
    kind = f"streamed ({STREAM_TOKENS} tokens, one SSE event each)" if bench.stream else "plain"
    print(f"turns: {kind}")
    gc.freeze()  # as in the engines: full collections skip the startup objects
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    _table(bench, fixed_load=False)
    if fixed_load:
        _table(bench, fixed_load=True)
    problems = _checks(bench)
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    if memory:
        _memory_table()
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    main()
