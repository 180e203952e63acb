"""Boomerang against the production baseline, measured by vLLM's own multi-turn client.

Why: a user compares Boomerang with what they would run without it: plain vLLM P/D with a good
router and prefix caching on, on the same engines and the same conversations. This benchmark
runs exactly that comparison on the local CPU stack, with a client nobody here wrote (vLLM's
`benchmarks/multi_turn`, fetched at run time: `multiturn_client.py`), and prints one table per
regime.

Modes (router and engine settings; everything else is `examples/local-cpu.yaml` with P's prefix
cache on):
- `plain`: bidirectional transfer off on the engines, the router routing by least load;
- `affinity`: the same, with conversation affinity for P and D and routing by the engines' KV
  events (what llm-d and Dynamo do);
- `static`, `adaptive`: Boomerang (bidirectional on) in each tuning mode.
Regimes: `spare` (KV to spare), `pressure` (both engines at `PRESSURE_BLOCKS` blocks, so that
retained and active work exceed them), `2p1d` and `2p2d` (two prefill engines, one or two
decoders).

Method, per regime: the two engine sets (bidirectional off and on) run side by side when they
fit (1P1D: four engines), and every mode's runs alternate ABBA over `--rounds` in one window;
else the sets alternate (off, on, off) with the modes ABBA within each. Every run gets a fresh
router, its own text (so no run's prompts hit another's prefix cache) and the same
conversation shapes (the client's seeded generator); between runs D's retained leases are
released (`POST /yield`). Per run: TTFT of first turns and follow-ups (p50/p90/p99),
end-to-end latency, wall time, turns/s, stalled turns (TTFT over a bound several times the
longest prompt's measured prefill), tokens computed, cached and pulled on P and D (the
engines' own `prompt_tokens_by_source`), and D's retained block-seconds (its lease API,
sampled every second). Router timeouts sit ten times above the
stall bound, so that none can hide a stall.

    make bench-production                      # every regime, 2 rounds (about an hour)
    make bench-production ARGS="--quick"       # spare and pressure, 8 conversations, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import machine
import multiturn_client
import production_report as report
import yaml
from bench_paths import ITL_BUDGET_S
from bench_ttft import REPO

from boomerang.connector.config import LEASE_PATH
from boomerang.connector.model import corpus, model_dir
from boomerang.local import calibrate, placement, processes, stack
from boomerang.local.engine_client import scrape, totals

BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PRESSURE_BLOCKS = 200
"""Both engines' KV in the pressure regime (25,600 tokens at 128-token blocks): 8 concurrent
conversations of 2-5k tokens plus what D retains exceed it."""
BASELINES = ("plain", "affinity")


@dataclass(frozen=True)
class Mode:
    bidirectional: bool
    router: dict[str, Any]


MODES: dict[str, Mode] = {
    "plain": Mode(
        False, {"bidirectional": False, "affinity": False, "kv_events": {"enabled": False}}
    ),
    "affinity": Mode(False, {"bidirectional": False, "affinity": True}),
    "static": Mode(True, {"tuning": {"mode": "static"}}),
    "adaptive": Mode(True, {"tuning": {"mode": "adaptive", "itl_budget_s": ITL_BUDGET_S}}),
}


@dataclass(frozen=True)
class Regime:
    prefill: int = 1
    decode: int = 1
    blocks: int | None = None


REGIMES: dict[str, Regime] = {
    "spare": Regime(),
    "pressure": Regime(blocks=PRESSURE_BLOCKS),
    "2p1d": Regime(prefill=2),
    "2p2d": Regime(prefill=2, decode=2),
}
"""`2p2d` needs three cores (a decoder spins on its core while it retains blocks, so each gets
its own: `boomerang.local.placement`); on two cores the local runtime refuses it."""


def conversations(n: int) -> dict[str, Any]:
    """The client's generator config: n conversations of 4-6 user turns, 1.5-3k-token first
    prompts, 20-200-token user turns, 32-96-token answers."""
    uniform = lambda lo, hi: {"distribution": "uniform", "min": lo, "max": hi}  # noqa: E731
    return {
        "filetype": "generate_conversations",
        "num_conversations": n,
        "text_files": ["text.txt"],
        "print_stats": False,
        "prompt_input": {
            "num_turns": uniform(8, 12),
            "common_prefix_num_tokens": {"distribution": "constant", "value": 0},
            "prefix_num_tokens": uniform(1500, 3000),
            "num_tokens": uniform(20, 200),
        },
        "prompt_output": {"num_tokens": uniform(32, 96)},
    }


def manifest(regime: Regime, bidirectional: bool) -> Any:
    """examples/local-cpu.yaml with P's prefix cache on, the regime's replicas and KV size, the
    mode's transfer direction."""
    from boomerang.operator.api import DisaggregatedDeployment

    data = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    spec = data["spec"]
    spec["prefill"]["prefixCaching"] = True
    spec["prefill"]["replicas"], spec["decode"]["replicas"] = regime.prefill, regime.decode
    spec["kvTransfer"]["bidirectional"] = bidirectional
    if regime.blocks is not None:
        spec["model"]["maxModelLen"] = 8192
        spec["engine"]["extraArgs"] += ["--num-gpu-blocks-override", str(regime.blocks)]
    return DisaggregatedDeployment.model_validate(data)


PORTS = stack.LocalPorts(
    router=38080,
    prefill=38100,
    decode=38200,
    prefill_side_channel=35600,
    decode_side_channel=35700,
)
"""The benchmark's own ports (replica i of a role adds i): apart from `boomerang up`'s."""
PORTS_B = stack.LocalPorts(**{f.name: getattr(PORTS, f.name) + 10_000 for f in fields(PORTS)})
"""A second engine set beside the first, every port 10,000 higher (its events and replay ports
too stay apart)."""
SIDE_BY_SIDE_ENGINES = 4
"""Both engine sets of a regime run at once when they have this many engines in all (1P1D
twice): the runs of every mode then alternate in one window, with no drift of the host's
speed between the sets (measured: up to 5x on follow-up TTFT between two sets in a row)."""


@dataclass
class Engines:
    """One engine set: P and D urls, the processes, the lease token."""

    dd: Any
    run_dir: Path
    ports: stack.LocalPorts = PORTS
    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    @property
    def token(self) -> str:
        return stack.read_lease_token(self.run_dir)


@contextlib.contextmanager
def engines(
    dd: Any, venv: Path, log: Any = print, ports: stack.LocalPorts = PORTS
) -> Iterator[Engines]:
    """Every engine replica `dd` asks for, placed as `boomerang up` places them (ports and a
    core per replica, `boomerang.local.placement`), lease API on; stopped on exit."""
    run_dir = Path(tempfile.mkdtemp(prefix="boomerang-bench-production-"))
    env = dict(os.environ)
    stack.build_model(venv, dd.spec.model.source, env)
    token = stack.read_lease_token(run_dir)
    es = Engines(dd, run_dir, ports=ports)
    replicas = placement.plan(stack.replica_counts(dd), ports, sorted(os.sched_getaffinity(0)))
    specs = [
        stack.engine_spec(
            dd,
            r.role,
            engine_venv=venv,
            ports=ports,
            run_dir=run_dir,
            base_env=env,
            lease_token=token,
            index=r.index,
            cpu=r.cpu,
        )
        for r in replicas
    ]
    for r in replicas:
        (es.prefill if r.role == "prefill" else es.decode).append(r.url)
    log(f"starting {len(specs)} engines, logs in {run_dir}")
    try:
        for spec in specs:
            es.pids.append(processes.spawn(spec).pid)
        for spec, pid in zip(specs, es.pids, strict=True):
            processes.wait_healthy(spec, pid, 900)
        yield es
    finally:
        for pid in reversed(es.pids):
            processes.stop(pid, timeout=30)


def router_config(es: Engines, overrides: dict[str, Any], port: int) -> Any:
    return stack.router_settings(
        es.dd,
        es.ports,
        listen_port=port,
        lease_token_file=str(stack.lease_token_file(es.run_dir)),
        log_json=True,
        **overrides,
    )


@contextlib.contextmanager
def router(es: Engines, name: str, overrides: dict[str, Any], port: int = 38080) -> Iterator[str]:
    """A router process with the rendered config plus `overrides`, ready with P and D."""
    cfg_file = es.run_dir / f"router-{name}.yaml"
    cfg_file.write_text(yaml.safe_dump(router_config(es, overrides, port)))
    spec = stack.router_spec(name, cfg_file, port, es.run_dir, dict(os.environ))
    pid = processes.spawn(spec).pid
    try:
        processes.wait_healthy(spec, pid, 60)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url)
        yield url
    finally:
        processes.stop(pid, timeout=30)


def _wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/ready", timeout=5) as resp:
                body = json.loads(resp.read())
            if body.get("ready") and not body.get("alone"):
                return
        time.sleep(0.5)
    raise RuntimeError(f"router {url} not ready with P and D in {timeout_s:.0f} s")


def lease_call(url: str, token: str, op: str = "") -> dict[str, Any]:
    data = b"{}" if op else None
    req = urllib.request.Request(
        f"{url}{LEASE_PATH}{'/' + op if op else ''}",
        data,
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def retained_blocks(es: Engines) -> float:
    total = 0.0
    for d in es.decode:
        with contextlib.suppress(OSError, ValueError):
            total += lease_call(d, es.token).get("retained", {}).get("retained_blocks", 0)
    return total


def release_retained(es: Engines, timeout_s: float = 60.0) -> None:
    """Every D releases what it retains, so that the next run starts with D's KV free."""
    for d in es.decode:
        with contextlib.suppress(OSError, ValueError):
            lease_call(d, es.token, "yield")
    deadline = time.monotonic() + timeout_s
    while retained_blocks(es) > 0 and time.monotonic() < deadline:
        time.sleep(0.5)


class Sampler(threading.Thread):
    """D's retained blocks, every `interval` seconds."""

    def __init__(self, es: Engines, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.es, self.interval = es, interval
        self.points: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.points.append((time.perf_counter(), retained_blocks(self.es)))
            self.halt.wait(self.interval)


def token_sources(urls: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for url in urls:
        for source, value in totals(scrape(url), BY_SOURCE, "source").items():
            out[source] = out.get(source, 0.0) + value
    return out


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    names = {"local_compute": "computed", "local_cache_hit": "cached"}
    names["external_kv_transfer"] = "pulled"
    return {names.get(k, k): after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def router_counts(url: str) -> dict[str, dict[str, float]]:
    page = scrape(url)
    return {
        "reuse": totals(page, "boomerang_router_reuse_total", "outcome"),
        "path": totals(page, "boomerang_router_path_total", "path"),
        "claims": totals(page, "boomerang_router_claims_total", "result"),
    }


@dataclass
class Sitting:
    """What every run of one sitting shares."""

    args: argparse.Namespace
    client: multiturn_client.Client
    venv: Path
    out: Path
    header: str = ""
    runs: list[dict[str, Any]] = field(default_factory=list)
    serial: int = 0

    def log(self, message: str) -> None:
        print(message, flush=True)


WARM_UP_CONVERSATIONS = 8


def warm_up(s: Sitting, es: Engines, regime: str, name: str, timing: dict[str, Any]) -> None:
    """A short run, not recorded, on engines just started: the first requests of a fresh CPU
    engine are slower (its kernels meet each new shape once), which would fall on one mode."""
    one_run(s, es, regime, name, timing, record=False)


def one_run(
    s: Sitting,
    es: Engines,
    regime: str,
    name: str,
    timing: dict[str, Any],
    record: bool = True,
) -> None:
    """One mode on running engines: fresh router, fresh text, the client, the counters."""
    s.serial += 1
    n = s.args.conversations if record else WARM_UP_CONVERSATIONS
    work = s.out / "runs" / f"{s.serial:02d}-{regime}-{name}{'' if record else '-warm-up'}"
    work.mkdir(parents=True, exist_ok=True)
    lines = corpus(seed=1000 + s.serial, lines=6000)
    (work / "text.txt").write_text("\n".join(lines) + "\n")
    release_retained(es)
    overrides = {**MODES[name].router, "timeouts": timing["timeouts"]}
    with router(es, f"{regime}-{name}", overrides) as url:
        before = {"p": token_sources(es.prefill), "d": token_sources(es.decode)}
        sampler = Sampler(es)
        sampler.start()
        t0 = time.perf_counter()
        try:
            records = multiturn_client.run(
                s.client,
                url=url,
                model_dir=model_dir("tiny"),
                served_name=es.dd.spec.model.served_name,
                config=conversations(n),
                clients=s.args.clients,
                seed=s.args.seed,
                workdir=work,
                timeout_s=timing["client_timeout_s"],
            )
        finally:
            sampler.halt.set()
            sampler.join()
        ran = time.perf_counter() - t0
        after = {"p": token_sources(es.prefill), "d": token_sources(es.decode)}
        counts = router_counts(url)
    if not record:
        return
    run = {
        "regime": regime,
        "mode": name,
        "serial": s.serial,
        "client_s": ran,
        "summary": report.summarize(records, timing["stall_bound_s"]),
        "tokens": {r: moved(before[r], after[r]) for r in ("p", "d")},
        "retained_block_s": report.block_seconds(sampler.points),
        "router": counts,
        "records": records,
    }
    s.runs.append(run)
    f = run["summary"]["followup_ttft_s"]
    s.log(
        f"  {regime} {name}: follow-up TTFT p50 {f['p50']:.3f} s p99 {f['p99']:.3f} s, "
        f"wall {run['summary']['wall_s']:.0f} s, stalled {run['summary']['stalled']}"
    )


def abba(modes: Sequence[str], rounds: int) -> list[list[str]]:
    """One list of `modes` per round, reversed every other round (A B, B A, A B, ...)."""
    return [list(modes) if r % 2 == 0 else list(modes)[::-1] for r in range(rounds)]


def order(modes: Sequence[str], rounds: int) -> list[list[str]]:
    """Engine sets in ABA order (bidirectional off, on, off), modes ABBA within a set type."""
    seq_off = abba([m for m in modes if not MODES[m].bidirectional], rounds)
    seq_on = abba([m for m in modes if MODES[m].bidirectional], rounds)
    first_off = [m for r in seq_off[: (rounds + 1) // 2] for m in r]
    last_off = [m for r in seq_off[(rounds + 1) // 2 :] for m in r]
    sets = [first_off, [m for r in seq_on for m in r], last_off]
    return [s for s in sets if s]


def timing_for(s: Sitting, es: Engines, regime: Regime) -> dict[str, Any]:
    cost = calibrate.measure(es.prefill[0], es.dd.spec.model.served_name)
    longest = 6000  # 3k first prompt + five 200-token turns + five 96-token answers, rounded up
    # A stall waits for memory: until a timeout or D's TTL (minutes). On two cores with three
    # engines and eight clients, queueing alone reaches 15 s, so the bound sits above it.
    stall = max(30.0, 8 * cost.seconds(longest))
    timeouts = {
        "prefill_s": 10 * stall,
        "decode_first_byte_s": 10 * stall,
        "decode_total_s": 10 * stall + 900,
    }
    s.log(f"  P: {cost.rate(1024):.0f} tokens/s at 1024; stall bound {stall:.1f} s")
    return {"stall_bound_s": stall, "timeouts": timeouts, "client_timeout_s": 20 * stall + 900}


def regime_runs(s: Sitting, regime: str) -> None:
    spec = REGIMES[regime]
    modes = s.args.modes
    both = {MODES[m].bidirectional for m in modes} == {True, False}
    if both and 2 * (spec.prefill + spec.decode) <= SIDE_BY_SIDE_ENGINES:
        side_by_side(s, regime, spec)
        return
    for names in order(modes, s.args.rounds):
        dd = manifest(spec, MODES[names[0]].bidirectional)
        with engines(dd, s.venv, s.log) as es:
            timing = timing_for(s, es, spec)
            warm_up(s, es, regime, names[0], timing)
            for name in names:
                one_run(s, es, regime, name, timing)


def side_by_side(s: Sitting, regime: str, spec: Regime) -> None:
    """Both engine sets at once; every mode's runs alternate ABBA over the rounds. Between runs
    D releases what it retained (`one_run`), so the set not in use sits idle."""
    off, on = manifest(spec, False), manifest(spec, True)
    with engines(off, s.venv, s.log) as e_off, engines(on, s.venv, s.log, PORTS_B) as e_on:
        timing = timing_for(s, e_on, spec)
        modes = list(s.args.modes)
        for es, bidirectional in ((e_off, False), (e_on, True)):
            name = next(m for m in modes if MODES[m].bidirectional == bidirectional)
            warm_up(s, es, regime, name, timing)
        for names in abba(modes, s.args.rounds):
            for name in names:
                one_run(s, e_on if MODES[name].bidirectional else e_off, regime, name, timing)


def results(s: Sitting) -> dict[str, Any]:
    pooled: dict[str, dict[str, Any]] = {}
    for run in s.runs:
        pooled.setdefault(run["regime"], {}).setdefault(run["mode"], [])
    for regime, modes in pooled.items():
        for mode in modes:
            runs = [r for r in s.runs if r["regime"] == regime and r["mode"] == mode]
            modes[mode] = report.pooled(runs)
    return {
        "machine": s.header,
        "client": f"vLLM {multiturn_client.VERSION} benchmarks/multi_turn",
        "workload": conversations(s.args.conversations),
        "clients": s.args.clients,
        "rounds": s.args.rounds,
        "pooled": pooled,
        "runs": s.runs,
    }


def print_tables(res: dict[str, Any]) -> None:
    print(res["machine"])
    print(f"client: {res['client']}, {res['clients']} clients, {res['rounds']} round(s)\n")
    for regime, modes in res["pooled"].items():
        print(report.table(regime, modes, report.best_baseline(modes, BASELINES)) + "\n")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--regimes", default="spare,pressure,2p1d", help="also: 2p2d (3+ cores)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="spare and pressure, 8 conversations")
    ap.add_argument("--out", type=Path, default=REPO / "connector" / "bench")
    ap.add_argument("--replot", action="store_true", help="tables and chart from OUT only")
    args = ap.parse_args()
    if args.quick:
        args.regimes, args.conversations, args.rounds = "spare,pressure", 8, 1
    args.regimes = [r for r in args.regimes.split(",") if r]
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [r for r in args.regimes if r not in REGIMES]
    unknown += [m for m in args.modes if m not in MODES]
    if unknown:
        ap.error(f"unknown regime or mode: {', '.join(unknown)}")
    return args


def main() -> None:
    args = parse_args()
    result_file = args.out / "production.json"
    if args.replot:
        res = json.loads(result_file.read_text())
    else:
        venv = stack.ensure_engine_venv()
        client = multiturn_client.ensure()
        work = Path(tempfile.mkdtemp(prefix="boomerang-production-"))
        s = Sitting(args, client, venv, work)
        s.header = f"machine: {machine.describe(venv)}"
        s.log(f"{s.header}\nruns in {work}")
        for regime in args.regimes:
            regime_runs(s, regime)
        res = results(s)
        slim = {**res, "runs": [{k: v for k, v in r.items() if k != "records"} for r in s.runs]}
        result_file.write_text(json.dumps(slim, indent=1))
        (work / "production-full.json").write_text(json.dumps(res))
    print_tables(res)
    report.chart(res["pooled"], args.out / "production.png")


if __name__ == "__main__":
    main()
