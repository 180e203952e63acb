"""Boomerang against the production baseline, measured by vLLM's own multi-turn client.

Why: a user compares Boomerang with what they would run without it: stock vLLM P/D with prefix
caching on, routed by vLLM's own proxy or by the policies peers ship (decode-first included),
on the same engines and the same conversations. This benchmark runs exactly that comparison on
the local CPU stack, with a client nobody here wrote (vLLM's `benchmarks/multi_turn`, fetched
at run time: `multiturn_client.py`), and prints every figure a user weighs: first-turn and
follow-up TTFT, TPOT, wall time and lost turns, with their spread over the rounds.

What runs (`modes.py`): the baselines on stock vLLM engines (`stock.py`: none of
Boomerang's code inside, nothing polls them but `/metrics`), Boomerang's modes on its own
engines, Adaptive exactly as the API defaults it.

Method, per regime: the engine sets run one after the other, never side by side on shared
cores (stock, Boomerang, stock: `modes.order`), modes ABBA within a set, a warm-up
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
    make bench-production ARGS="--replot --merge 'R, router abc1234=OUT2' --publish"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boomerang.connector.launch.model import corpus, model_dir
from boomerang.local import calibrate, processes, stack
from boomerang.local.revision import source_revision as source_revision

from bench.harness import engine_watch, machine, multiturn_client, stock
from bench.harness.repo import REPO, RESULTS
from bench.production import equal, merge, report, slo, store
from bench.production.engines import (
    Engines,
    Sampler,
    engines,
    manifest,
    moved,
    release_retained,
    retained_blocks,
    router,
    router_counts,
    token_sources,
)
from bench.production.modes import (
    AA,
    BASELINES,
    DEFAULT_MODE,
    MODES,
    PEERS,
    QUIET_BASELINES,
    REGIMES,
    Regime,
    generator_config,
    longest_prompt,
    order,
)


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
    config = {**overrides, "timeouts": timing["timeouts"]}
    if s.args.tell_tpot and "tuning" in overrides:  # Boomerang's own modes
        config["tuning"] = {**overrides["tuning"], "tpot_slo_s": told_tpot_s(timing)}
    with router(es, f"{regime}-{name}", config) as url:
        yield url


def told_tpot_s(timing: Mapping[str, Any]) -> float:
    """The TPOT bound the goodput counts (`slo.tpot_slo_s` at its headline scale),
    as an operator would set it (`tuning.slo.tpot`)."""
    return slo.tpot_slo_s(timing["slo_basis"], slo.GOODPUT_SCALE)


@dataclass
class Sitting:
    """What every run of one sitting shares."""

    args: argparse.Namespace
    client: multiturn_client.Client
    venv: Path
    out: Path
    header: str = ""
    revision: str | None = None
    """The source's commit (`source_revision`)."""
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
        "slo_basis": timing["slo_basis"],
        "told_tpot_s": told_tpot_s(timing) if s.args.tell_tpot else None,
        "p_tokens_per_s_at_1024": timing["p_tokens_per_s_at_1024"],
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
    tpot = calibrate.measure_tpot(es.decode[0], es.dd.spec.model.served_name)
    s.log(
        f"  P: {cost.rate(1024):.0f} tokens/s at 1024; D idle TPOT {tpot * 1000:.1f} ms; "
        f"stall bound {stall:.1f} s"
    )
    return {
        "stall_bound_s": stall, "timeouts": timeouts, "client_timeout_s": 20 * stall + 900,
        "p_tokens_per_s_at_1024": cost.rate(1024),
        "slo_basis": {"p_linear_s": cost.linear_s, "p_quadratic_s": cost.quadratic_s,
                      "d_tpot_s": tpot},
    }  # fmt: skip


def regime_runs(s: Sitting, regime: str) -> None:
    """The regime's engine sets one after the other (never side by side), modes ABBA."""
    spec = REGIMES[regime]
    for names in order(list(s.args.modes), s.args.rounds):
        kind = MODES[names[0]].engines
        dd = manifest(spec, bidirectional=kind == "boomerang")
        with engines(dd, s.venv, s.log, stock_engines=kind == "stock", pin=True) as es:
            s.engine_sets.append(
                {"regime": regime, "stock": kind == "stock", "kind": kind, "engines": es.started}
            )
            timing = timing_for(s, es, spec)
            s.engine_sets[-1]["p_tokens_per_s_at_1024"] = timing["p_tokens_per_s_at_1024"]
            s.engine_sets[-1]["slo_basis"] = timing["slo_basis"]
            warm_up = next(m for m in names if MODES[m].router is not None)
            one_run(s, es, regime, warm_up, timing, record=False)
            for name in names:
                one_run(s, es, regime, name, timing)


def results(s: Sitting) -> dict[str, Any]:
    pooled = report.pooled_by_regime(s.runs)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "revision": s.revision,
        "command": "make bench-production ARGS=" + json.dumps(" ".join(s.args.argv)),
        "machine": s.header,
        "client": f"vLLM {multiturn_client.VERSION} benchmarks/multi_turn",
        "workloads": {r: generator_config(REGIMES[r].workload) for r in pooled},
        "rounds": s.args.rounds,
        "default_mode": DEFAULT_MODE,
        "baselines": list(BASELINES),
        "quiet_baselines": list(QUIET_BASELINES),
        "peers": list(PEERS),
        "twin": AA,
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
    if quiet := report.same_engine_headline(res):
        print(f"{res['default_mode']} against the same policies on Boomerang's engines:\n")
        print(quiet + "\n")
    for block in report.equal_blocks(res):
        print(block + "\n")


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
    ap.add_argument(
        "--equal", action="store_true",
        help="equal engines only: the peers' policies on Boomerang's engines with "
        "bidirectional off, the default mode and its A/A twin (modes.PEERS, AA)",
    )  # fmt: skip
    ap.add_argument(
        "--tell-tpot", action="store_true",
        help="give Boomerang's modes the TPOT bound the goodput counts (tuning.tpot_slo_s), "
        "as an operator sets tuning.slo.tpot; the peers have no such setting",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS / "production")
    ap.add_argument("--replot", action="store_true", help="tables and chart from OUT only")
    ap.add_argument(
        "--exclude", default="",
        help="with --replot: SERIALS:REASON, runs left out of the pooled figures (kept, marked)",
    )  # fmt: skip
    ap.add_argument(
        "--merge", action="append", default=[], metavar="[LABEL=]PATH",
        help="with --replot: add another sitting's runs (its results folder) to "
        "OUT's, its one regime renamed LABEL (merge.py); repeatable",
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
    if args.equal:
        args.modes = [*PEERS, DEFAULT_MODE, AA]
    if args.merge and not args.replot:
        ap.error("--merge adds to published results: use it with --replot")
    unknown = [r for r in args.regimes if r not in REGIMES]
    unknown += [m for m in args.modes if m not in MODES]
    if unknown:
        ap.error(f"unknown regime or mode: {', '.join(unknown)}")
    return args


def main() -> None:
    args = parse_args()
    if args.replot:
        res = store.load(args.out)
        if args.merge:
            try:
                res = merge.merged(res, args.merge)
            except (OSError, ValueError) as exc:
                sys.exit(f"--merge: {exc}")
        if args.exclude:
            serials, _, why = args.exclude.partition(":")
            report.exclude(res, {int(n) for n in serials.split(",") if n}, why)
        before = res["pooled"]
        report.repool(res)
        if args.merge or args.exclude or res["pooled"] != before:
            store.save(args.out, res)
    else:
        # Made before the first run, not found missing after the last: a sitting that cannot
        # write its results must not run for an hour first.
        args.out.mkdir(parents=True, exist_ok=True)
        venv = stack.ensure_engine_venv()
        client = multiturn_client.ensure()
        work = Path(tempfile.mkdtemp(prefix="boomerang-production-"))
        s = Sitting(args, client, venv, work)
        s.header = f"machine: {machine.describe(venv)}"
        s.revision = source_revision(REPO)
        s.log(f"{s.header}\nsource: {s.revision}; runs in {work}")
        try:
            for regime in args.regimes:
                regime_runs(s, regime)
        finally:  # what ran is kept, also when a run found the engines busy
            res = results(s)
            store.save(args.out, res)
    print_tables(res)
    report.chart(res["pooled"], args.out / "production.png")
    equal.chart(res["pooled"], args.out / "production_slo.png")
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
