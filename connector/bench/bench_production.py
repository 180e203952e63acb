"""Boomerang against the production baseline, measured by vLLM's own multi-turn client.

Why: a user compares Boomerang with what they would run without it: stock vLLM P/D with prefix
caching on, routed by vLLM's own proxy or by the policies peers ship (decode-first included),
on the same engines and the same conversations. This benchmark runs exactly that comparison on
the local CPU stack, with a client nobody here wrote (vLLM's `benchmarks/multi_turn`, fetched
at run time: `multiturn_client.py`), and prints every figure a user weighs: first-turn and
follow-up TTFT, TPOT, wall time and lost turns, with their spread over the rounds.

What runs (`production_modes.py`): the baselines on stock vLLM engines (`stock.py`: none of
Boomerang's code inside, nothing polls them but `/metrics`), Boomerang's modes on its own
engines, Adaptive exactly as the API defaults it.

Method, per regime: the engine sets run one after the other, never side by side on shared
cores (stock, Boomerang, stock: `production_modes.order`), modes ABBA within a set, a warm-up
run on every fresh set. Before every run each engine must be idle by its own metrics (nothing
running or waiting, no KV block in use, D retaining nothing: `engine_watch.py`) or the sitting
stops. Every run gets a fresh router (or proxy), its own text (so no run's prompts hit another's
prefix cache) and the same conversation shapes (the client's seeded generator, run once up
front so that every turn the client should send is known: one it never recorded is *lost*).
Per run: the client's per-request records, each engine's CPU seconds, P's and D's tokens
computed, cached and pulled (the engines' own `prompt_tokens_by_source`), D's retained
block-seconds (Boomerang's engines: their lease API). Router timeouts sit ten times above the
stall bound, so that none can hide a stall.

    make bench-production                        # spare, pressure, 2p1d; every mode, 5 rounds
    make bench-production ARGS="--sweep"         # and the sweep's regimes (over an hour)
    make bench-production ARGS="--quick"         # spare, 8 conversations, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import engine_watch
import machine
import multiturn_client
import production_report as report
import stock
import yaml
from bench_ttft import REPO
from production_modes import (
    BASELINES,
    DEFAULT_MODE,
    MODES,
    REGIMES,
    Regime,
    generator_config,
    longest_prompt,
    order,
)

from boomerang.connector.config import LEASE_PATH
from boomerang.connector.model import corpus, model_dir
from boomerang.local import calibrate, placement, processes, stack
from boomerang.local.engine_client import scrape, totals

BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def manifest(regime: Regime, bidirectional: bool) -> Any:
    """examples/local-cpu.yaml with P's prefix cache on, the regime's replicas and KV sizes,
    the transfer direction of the engine set."""
    from boomerang.operator.api import DisaggregatedDeployment

    data = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    spec = data["spec"]
    spec["prefill"]["prefixCaching"] = True
    spec["prefill"]["replicas"], spec["decode"]["replicas"] = regime.prefill, regime.decode
    spec["kvTransfer"]["bidirectional"] = bidirectional
    spec["model"]["maxModelLen"] = regime.max_model_len
    for role, blocks in (("prefill", regime.p_blocks), ("decode", regime.d_blocks)):
        if blocks is not None:
            spec[role]["extraArgs"] = ["--num-gpu-blocks-override", str(blocks)]
    return DisaggregatedDeployment.model_validate(data)


PORTS = stack.LocalPorts(
    router=38080,
    prefill=38100,
    decode=38200,
    prefill_side_channel=35600,
    decode_side_channel=35700,
)
"""The benchmark's own ports (replica i of a role adds i): apart from `boomerang up`'s."""


@dataclass
class Engines:
    """One engine set: P and D urls, the processes (name -> pid, each a process group), the
    lease token (Boomerang's engines only), whether they are stock vLLM."""

    dd: Any
    run_dir: Path
    ports: stack.LocalPorts = PORTS
    stock: bool = False
    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    started: list[dict[str, Any]] = field(default_factory=list)
    """How each engine was started (command, VLLM_PLUGINS), for the record."""

    @property
    def token(self) -> str:
        return stack.read_lease_token(self.run_dir)

    @property
    def urls(self) -> list[str]:
        return [*self.prefill, *self.decode]


def pinned(spec: processes.ProcessSpec, cpu: int) -> processes.ProcessSpec:
    """The engine with every process on its own core (`taskset`), as a pod's cpuset keeps a
    pod's processes: placement pins only an engine's compute threads, so its API server and
    engine core would float onto the other engine's core (a decoder stepping continuously then
    takes CPU from the prefill engine, which no pod on its own node can do). Both engine sets,
    stock and Boomerang's, run so."""
    return dataclasses.replace(spec, cmd=["taskset", "-c", str(cpu), *spec.cmd])


@contextlib.contextmanager
def engines(
    dd: Any,
    venv: Path,
    log: Any = print,
    ports: stack.LocalPorts = PORTS,
    stock_engines: bool = False,
    pin: bool = False,
) -> Iterator[Engines]:
    """Every engine replica `dd` asks for, placed as `boomerang up` places them (ports and a
    core per replica, `boomerang.local.placement`): Boomerang's engines with their lease API
    on, or (`stock_engines`) stock vLLM engines with the same arguments (`stock.py`); `pin`:
    every process of an engine on its core (`pinned`)."""
    run_dir = Path(tempfile.mkdtemp(prefix="boomerang-bench-production-"))
    env = dict(os.environ)
    stack.build_model(venv, dd.spec.model.source, env)
    token = None if stock_engines else stack.read_lease_token(run_dir)
    es = Engines(dd, run_dir, ports=ports, stock=stock_engines)
    replicas = placement.plan(stack.replica_counts(dd), ports, sorted(os.sched_getaffinity(0)))
    specs = []
    for r in replicas:
        spec = stack.engine_spec(
            dd, r.role, engine_venv=venv, ports=ports, run_dir=run_dir, base_env=env,
            lease_token=token, index=r.index, cpu=r.cpu,
        )  # fmt: skip
        if stock_engines:
            spec = stock.stock_spec(spec, venv, r.cpu, run_dir)
        if pin:
            spec = pinned(spec, r.cpu)
        specs.append(spec)
        es.started.append(stock.describe(spec))
        (es.prefill if r.role == "prefill" else es.decode).append(r.url)
    kind = "stock vLLM" if stock_engines else "Boomerang"
    log(f"starting {len(specs)} {kind} engines, logs in {run_dir}")
    try:
        for spec in specs:
            es.pids[spec.name] = processes.spawn(spec).pid
        for spec in specs:
            processes.wait_healthy(spec, es.pids[spec.name], 900)
        yield es
    finally:
        for pid in reversed(es.pids.values()):
            processes.stop(pid, timeout=30)


def router_config(es: Engines, overrides: dict[str, Any], port: int) -> Any:
    """The router's configuration for the engine set (no lease token for stock engines: they
    have no lease API, and nothing but their metrics is polled)."""
    token = {} if es.stock else {"lease_token_file": str(stack.lease_token_file(es.run_dir))}
    return stack.router_settings(
        es.dd, es.ports, listen_port=port, log_json=True, **token, **overrides
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


@contextlib.contextmanager
def vllm_proxy(s: Sitting, es: Engines, port: int = 38080) -> Iterator[str]:
    """vLLM's own toy P/D proxy over the engine set (`stock.proxy_spec`)."""
    spec = stock.proxy_spec(
        s.client.proxy, s.client.python, port, es.prefill, es.decode,
        es.run_dir / "vllm-proxy.log",
    )  # fmt: skip
    pid = processes.spawn(spec).pid
    try:
        processes.wait_healthy(spec, pid, 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        processes.stop(pid, timeout=30)


@contextlib.contextmanager
def front(s: Sitting, es: Engines, regime: str, name: str, timing: dict[str, Any]) -> Iterator[str]:
    """What the client talks to in mode `name`: a fresh router, or vLLM's proxy."""
    overrides = MODES[name].router
    if overrides is None:
        with vllm_proxy(s, es) as url:
            yield url
        return
    with router(es, f"{regime}-{name}", {**overrides, "timeouts": timing["timeouts"]}) as url:
        yield url


@dataclass
class Sitting:
    """What every run of one sitting shares."""

    args: argparse.Namespace
    client: multiturn_client.Client
    venv: Path
    out: Path
    header: str = ""
    runs: list[dict[str, Any]] = field(default_factory=list)
    engine_sets: list[dict[str, Any]] = field(default_factory=list)
    serial: int = 0

    def log(self, message: str) -> None:
        print(message, flush=True)


WARM_UP_CONVERSATIONS = 8


def before_run(s: Sitting, es: Engines) -> dict[str, Any]:
    """Nothing left of the last run: D releases what it retains (Boomerang's engines), then
    every engine must be idle by its own metrics (`engine_watch.NotIdle` otherwise); returns
    their CPU use while idle (cores) for the record."""
    if not es.stock:
        release_retained(es)
        if (left := retained_blocks(es)) > 0:
            raise engine_watch.NotIdle(f"D still retains {left:.0f} blocks")
    engine_watch.wait_idle(es.urls)
    return engine_watch.idle_cpu(es.pids, seconds=s.args.idle_probe_s)


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
    spec = REGIMES[regime]
    workload = spec.workload
    n = workload.conversations if record else WARM_UP_CONVERSATIONS
    if s.args.conversations:
        n = min(n, s.args.conversations) if not record else s.args.conversations
    work = s.out / "runs" / f"{s.serial:02d}-{regime}-{name}{'' if record else '-warm-up'}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "text.txt").write_text("\n".join(corpus(seed=1000 + s.serial, lines=6000)) + "\n")
    config = generator_config(workload)
    config["num_conversations"] = n
    conversations = multiturn_client.generate(
        s.client, config=config, model_dir=model_dir("tiny"), seed=s.args.seed,
        prefix=f"r{s.serial:02d}-", workdir=work,
    )  # fmt: skip
    expected = multiturn_client.expected_turns(conversations)
    idle = before_run(s, es)
    with front(s, es, regime, name, timing) as url:
        before = {"p": token_sources(es.prefill), "d": token_sources(es.decode)}
        cpu_before = engine_watch.cpu_seconds(es.pids)
        sampler = Sampler(es) if not es.stock else None
        if sampler is not None:
            sampler.start()
        try:
            records = multiturn_client.run(
                s.client, url=url, model_dir=model_dir("tiny"),
                served_name=es.dd.spec.model.served_name, config=conversations,
                clients=min(workload.clients, n), seed=s.args.seed, workdir=work,
                timeout_s=timing["client_timeout_s"],
            )  # fmt: skip
        finally:
            if sampler is not None:
                sampler.halt.set()
                sampler.join()
        cpu = engine_watch.spent(cpu_before, engine_watch.cpu_seconds(es.pids))
        after = {"p": token_sources(es.prefill), "d": token_sources(es.decode)}
        counts = router_counts(url) if MODES[name].router is not None else {}
    if not record:
        return
    by_role = {r: sum(v for k, v in cpu.items() if k.startswith(r)) for r in ("prefill", "decode")}
    run = {
        "regime": regime,
        "mode": name,
        "serial": s.serial,
        "summary": report.summarize(
            records,
            timing["stall_bound_s"],
            expected,
            multiturn_client.answered((work / "client.log").read_text(errors="replace")),
        ),
        "stall_bound_s": timing["stall_bound_s"],
        "tokens": {r: moved(before[r], after[r]) for r in ("p", "d")},
        "cpu_s": by_role,
        "cpu_s_by_engine": cpu,
        "idle_cores_before": idle,
        "retained_block_s": report.block_seconds(sampler.points) if sampler else 0.0,
        "router": counts,
        "records": records,
    }
    s.runs.append(run)
    f, sm = run["summary"]["followup_ttft_s"], run["summary"]
    s.log(
        f"  {regime} {name}: first p50 {report.fmt_s(sm['first_ttft_s']['p50'])}, follow-up p50 "
        f"{report.fmt_s(f['p50'])} p99 {report.fmt_s(f['p99'])}, TPOT p50 "
        f"{report.fmt_s(sm['tpot_s']['p50'])}, wall {sm['wall_s']:.0f} s, lost {sm['lost']}, "
        f"CPU s P {by_role['prefill']:.0f} D {by_role['decode']:.0f}"
    )


def timing_for(s: Sitting, es: Engines, regime: Regime) -> dict[str, Any]:
    cost = calibrate.measure(es.prefill[0], es.dd.spec.model.served_name)
    longest = longest_prompt(regime.workload)
    # A stall waits for memory: until a timeout or D's TTL (minutes). On two cores eight
    # clients' queueing alone reaches 15 s, so the bound sits above it.
    stall = max(30.0, 8 * cost.seconds(longest))
    timeouts = {
        "prefill_s": 10 * stall,
        "decode_first_byte_s": 10 * stall,
        "decode_total_s": 10 * stall + 900,
    }
    s.log(f"  P: {cost.rate(1024):.0f} tokens/s at 1024; stall bound {stall:.1f} s")
    return {
        "stall_bound_s": stall, "timeouts": timeouts, "client_timeout_s": 20 * stall + 900,
        "p_tokens_per_s_at_1024": cost.rate(1024),
    }  # fmt: skip


def regime_runs(s: Sitting, regime: str) -> None:
    """The regime's engine sets one after the other (never side by side), modes ABBA."""
    spec = REGIMES[regime]
    for names in order(list(s.args.modes), s.args.rounds):
        stock_set = MODES[names[0]].engines == "stock"
        dd = manifest(spec, bidirectional=not stock_set)
        with engines(dd, s.venv, s.log, stock_engines=stock_set, pin=True) as es:
            s.engine_sets.append({"regime": regime, "stock": stock_set, "engines": es.started})
            timing = timing_for(s, es, spec)
            s.engine_sets[-1]["p_tokens_per_s_at_1024"] = timing["p_tokens_per_s_at_1024"]
            warm_up = next(m for m in names if MODES[m].router is not None)
            one_run(s, es, regime, warm_up, timing, record=False)
            for name in names:
                one_run(s, es, regime, name, timing)


def results(s: Sitting) -> dict[str, Any]:
    pooled = report.pooled_by_regime(s.runs)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "command": "make bench-production ARGS=" + json.dumps(" ".join(s.args.argv)),
        "machine": s.header,
        "client": f"vLLM {multiturn_client.VERSION} benchmarks/multi_turn",
        "workloads": {r: generator_config(REGIMES[r].workload) for r in pooled},
        "rounds": s.args.rounds,
        "default_mode": DEFAULT_MODE,
        "baselines": list(BASELINES),
        "engine_sets": s.engine_sets,
        "pooled": pooled,
        "runs": s.runs,
    }


def print_tables(res: dict[str, Any]) -> None:
    print(res["machine"])
    print(f"client: {res['client']}, {res['rounds']} round(s)\n")
    for regime, modes in res["pooled"].items():
        print(report.table(regime, modes) + "\n")
    baselines = [b for b in res["baselines"]]
    print(f"{res['default_mode']} (the default) against the strongest baseline per figure:\n")
    print(report.headline(res["pooled"], res["default_mode"], baselines) + "\n")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--regimes", default="spare,pressure,2p1d")
    ap.add_argument("--sweep", action="store_true", help="also every regime of the sweep")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conversations", type=int, default=0, help="override every workload's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--idle-probe-s", type=float, default=3.0, help="idle CPU probe per run")
    ap.add_argument("--quick", action="store_true", help="spare, 8 conversations, 1 round")
    ap.add_argument("--out", type=Path, default=REPO / "connector" / "bench")
    ap.add_argument("--replot", action="store_true", help="tables and chart from OUT only")
    ap.add_argument(
        "--exclude", default="",
        help="with --replot: SERIALS:REASON, runs left out of the pooled figures (kept, marked)",
    )  # fmt: skip
    ap.add_argument(
        "--publish", action="store_true",
        help="write the sitting into README.md's headline and docs/benchmarks.md",
    )  # fmt: skip
    args = ap.parse_args()
    args.argv = sys.argv[1:]
    if args.quick:
        args.regimes, args.conversations, args.rounds = "spare", 8, 1
    args.regimes = [r for r in args.regimes.split(",") if r]
    if args.sweep:
        args.regimes += [r for r, spec in REGIMES.items() if spec.sweep and r != "2p2d"]
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
        if args.exclude:
            serials, _, why = args.exclude.partition(":")
            report.exclude(res, {int(n) for n in serials.split(",") if n}, why)
            result_file.write_text(json.dumps(res, separators=(",", ":")))
    else:
        venv = stack.ensure_engine_venv()
        client = multiturn_client.ensure()
        work = Path(tempfile.mkdtemp(prefix="boomerang-production-"))
        s = Sitting(args, client, venv, work)
        s.header = f"machine: {machine.describe(venv)}"
        s.log(f"{s.header}\nruns in {work}")
        try:
            for regime in args.regimes:
                regime_runs(s, regime)
        finally:  # what ran is kept, also when a run found the engines busy
            res = results(s)
            result_file.write_text(json.dumps(res, separators=(",", ":")))
    print_tables(res)
    report.chart(res["pooled"], args.out / "production.png")
    if args.publish:
        publish(res)


def publish(res: dict[str, Any]) -> None:
    """The README's headline table and docs/benchmarks.md's sitting, from the results."""
    readme, docs = REPO / "README.md", REPO / "docs" / "benchmarks.md"
    block = report.readme_block(res)
    readme.write_text(
        report.splice(readme.read_text(), "<!-- headline:start -->", "<!-- headline:end -->", block)
    )
    sitting = report.sitting_block(res)
    docs.write_text(
        report.splice(docs.read_text(), "<!-- sitting:start -->", "<!-- sitting:end -->", sitting)
    )


if __name__ == "__main__":
    main()
