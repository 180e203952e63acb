"""Replay the seeded agent workload through the router and measure reuse: the issue-12 baseline.

Starts P, D (vLLM CPU, `examples/local-cpu.yaml` as it is, the decoder TTL scaled with the
think times) and one router in the chosen `--mode`, then replays `workload`'s plan:
every conversation in its own thread, turn N+1's prompt = turn N's prompt + D's output + the
new suffix (token ids, `/v1/completions`, streamed). It records per turn the TTFT (POST to the
first streamed token), the suffix size and the router's reuse outcome (the router's own
"Served turn" log line, matched by the X-Request-Id the runner sends; the router's
`boomerang_router_reuse_total` moved over the run is kept beside it as a check), and samples
D's KV usage from D's `/metrics` for the whole run and until D has freed what it retained.

Modes are router configurations (`MODES`): "static" is the router's defaults, the behaviour
today; "adaptive" turns on the router's adaptive tuning (per-turn path choice, learned
retention). The same `--seed` gives the same plan (its fingerprint is printed and stored), so
two runs' result files compare side by side:

    make bench-agents ARGS="--quick"                 # about 3 minutes: proves the pipeline
    make bench-agents                                # about 12 minutes: the static baseline
    make bench-agents ARGS="--mode adaptive"         # the same plan, adaptive
    make bench-agents ARGS="--compare e2e/bench/results/agents-static.json \
                                      e2e/bench/results/agents-adaptive.json"
    make bench-agents ARGS="--api responses"         # the same plan as an agent's Responses
                                                     # requests (responses.py)

Think times are real-world seconds in the plan and multiplied by `--time-scale` when replayed
(tens of seconds each would make a CPU run last hours); D's TTL is scaled by the same factor
(floor 30 s, the operator's minimum) so that which gaps outlive it stays as in the real world;
an adaptive router's retention floor (`retention_min_s`) is scaled alike (floor 1 s).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from boomerang.facts.engine import LEASE_PATH
from boomerang.local import calibrate, pdclient, stack
from boomerang.local.engine_client import samples, totals

from bench.agents import report, responses
from bench.agents import workload as aw
from bench.engine.paths import ITL_BUDGET_S
from bench.harness import machine
from bench.harness.pair import start_engines, start_routers, stop_all
from bench.harness.repo import REPO, RESULTS

MODES: dict[str, dict[str, Any]] = {
    "static": {},
    "adaptive": {"tuning": {"mode": "adaptive", "itl_budget_s": ITL_BUDGET_S}},
}
"""Router configuration overrides per mode: "static" is the defaults (today's behaviour),
"adaptive" the router's adaptive tuning with its own defaults; both replay the same plan."""
REAL_TTL_S = 480.0
"""D's default decoder TTL, which the scaled TTL stands for."""
MIN_TTL_S = 30.0
"""The operator refuses a shorter decoderBlocksTTL."""
USAGE = "vllm:kv_cache_usage_perc"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"


REAL_RETENTION_MIN_S = 10.0
"""The router's default `retention_min_s`, scaled like D's TTL (floor 1 s)."""


def scaled(overrides: dict[str, Any], time_scale: float) -> dict[str, Any]:
    """A mode's router overrides with its time constants scaled like the think times: an
    adaptive router's retention floor, as D's TTL is (so that which gaps it covers stays as
    in the real world)."""
    tuning = overrides.get("tuning")
    if not tuning or tuning.get("mode") != "adaptive" or "retention_min_s" in tuning:
        return overrides
    floor = max(1.0, round(REAL_RETENTION_MIN_S * time_scale, 2))
    return {**overrides, "tuning": {**tuning, "retention_min_s": floor}}


def manifest(ttl_s: float) -> Any:
    """examples/local-cpu.yaml as `boomerang up` runs it, with the decoder TTL set."""
    from boomerang.operator.api import DisaggregatedDeployment

    data = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    data["spec"]["kvTransfer"]["decoderBlocksTTL"] = f"{round(ttl_s)}s"
    return DisaggregatedDeployment.model_validate(data)


def kv_blocks(metrics: str) -> int:
    """D's KV cache size in blocks, from `vllm:cache_config_info` (the CPU build fills
    num_gpu_blocks with its CPU cache's blocks)."""
    for sample in samples(metrics, "vllm:cache_config_info"):
        for key in ("num_gpu_blocks", "num_cpu_blocks"):
            value = sample.labels.get(key, "")
            if value.isdigit() and int(value) > 0:
                return int(value)
    raise RuntimeError("D's /metrics has no vllm:cache_config_info with a block count")


def used_blocks(metrics: str, total: int) -> float:
    """Blocks in use on D: vLLM's usage is 1 - free / (total - 1) (one null block)."""
    return sum(s.value for s in samples(metrics, USAGE)) * (total - 1)


def held_leases(d_url: str, token: str) -> int | None:
    """How many finished requests D holds blocks for (its lease API), None if it did not say."""
    req = urllib.request.Request(d_url + LEASE_PATH, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            held = json.loads(resp.read()).get("held")
    except (OSError, ValueError):
        return None
    return held if isinstance(held, int) else None


class KvSampler(threading.Thread):
    """Reads D's used blocks every `interval` seconds; each sample is timed at the midpoint of
    its scrape. Blocks D retains live for the TTL, so an interval of a second or two sees every
    change; the error bound is `report.block_seconds`'s.

    Beside each sample it records what D says it holds (finished requests with pinned blocks)
    and what the router believes it retains (`/boomerang/v1/state`): where the two differ, D
    holds blocks that no lease of the router accounts for."""

    def __init__(self, d_url: str, interval: float, router: str = "", token: str = "") -> None:
        super().__init__(daemon=True)
        self.d_url, self.interval = d_url, interval
        self.router, self.token = router, token
        self.total = kv_blocks(pdclient.scrape(d_url))
        self.points: list[tuple[float, float]] = []
        self.holds: list[tuple[float, int | None, Any, Any]] = []
        """(time, D's held requests, router's leases, router's retention_s)"""
        self.halt = threading.Event()

    def sample(self) -> float:
        start = time.perf_counter()
        used = used_blocks(pdclient.scrape(self.d_url), self.total)
        self.points.append(((start + time.perf_counter()) / 2, used))
        return used

    def sample_holds(self) -> None:
        held = held_leases(self.d_url, self.token) if self.token else None
        state = pdclient.get_json(f"{self.router}/boomerang/v1/state") if self.router else {}
        leases, retention = state.get("leases"), state.get("retention_s")
        self.holds.append((time.perf_counter(), held, leases, retention))

    def run(self) -> None:
        while not self.halt.is_set():
            # A missed sample widens one interval; the error bound accounts for it.
            with contextlib.suppress(OSError):
                self.sample()
            self.sample_holds()
            self.halt.wait(self.interval)

    def drain(self, baseline: float, deadline: float) -> None:
        """Wait until D is back to `baseline` used blocks (all it retained freed), or `deadline`."""
        while time.perf_counter() < deadline:
            if self.points and self.points[-1][1] <= baseline:
                return
            time.sleep(self.interval)


def streamed_turn(
    ctx: dict[str, Any], prompt: list[int], conv: str, rid: str, max_tokens: int
) -> tuple[float, list[int]]:
    """One turn through the router: TTFT (POST to the first token) and D's output ids."""
    body = {**pdclient.completion_body(ctx["model"], prompt, max_tokens), "stream": True}
    body["conversation_id"] = conv
    start = time.perf_counter()
    ttft: float | None = None
    out: list[int] = []
    events = pdclient.stream_events(
        f"{ctx['router']}/v1/completions", body, ctx["timeout"], {"X-Request-Id": rid}
    )
    for arrived, chunk in events:
        for choice in chunk.get("choices", []):
            ids = choice.get("token_ids") or []
            if ttft is None and (ids or choice.get("text")):
                ttft = arrived - start
            out += ids
    if ttft is None or not out:
        raise RuntimeError("no token streamed")
    return ttft, out


def run_conversation(
    ctx: dict[str, Any], conv: aw.Conversation, t0: float, scale: float
) -> list[dict[str, Any]]:
    """Replay one conversation from its (scaled) start; a failed turn ends it."""
    time.sleep(max(t0 + conv.start_s * scale - time.perf_counter(), 0.0))
    history: list[Any] = []
    """Token ids (completions) or input items (responses): the conversation so far."""
    records = []
    for turn in conv.turns:
        time.sleep(turn.think_s * scale)
        rid = f"{ctx['label']}-{conv.id}-t{turn.index}"
        rec: dict[str, Any] = {"conversation": conv.id, "turn": turn.index, "kind": turn.kind}
        rec.update(new_tokens=turn.new_tokens, request_id=rid)
        rec["sent_s"] = time.perf_counter() - t0
        try:
            history, rec["ttft_s"], rec["prompt_tokens"] = send_turn(
                ctx, history, turn, f"{ctx['label']}-{conv.id}", rid
            )
        except (OSError, ValueError, RuntimeError, http.client.HTTPException) as exc:
            rec.update(ttft_s=None, outcome="error", error=str(exc)[:200])
            records.append(rec)
            break
        rec["done_s"] = time.perf_counter() - t0
        print(
            f"{rec['done_s']:6.0f} s  {conv.id} turn {turn.index:2d} {turn.kind:>11} "
            f"+{turn.new_tokens:4d} -> {rec['prompt_tokens']:5d} tokens: "
            f"TTFT {rec['ttft_s'] * 1000:6.0f} ms",
            flush=True,
        )
        records.append(rec)
    return records


def send_turn(
    ctx: dict[str, Any], history: list[Any], turn: aw.PlannedTurn, conv: str, rid: str
) -> tuple[list[Any], float, int]:
    """One planned turn in the chosen API: (history with the answer, TTFT, prompt tokens)."""
    if ctx.get("api") == "responses":
        items = history + responses.turn_items(turn)
        ttft, output, prompt_tokens = responses.streamed_turn(
            ctx, items, conv, rid, turn.max_tokens
        )
        return items + output, ttft, prompt_tokens
    prompt = history + turn.ids()
    ttft, out = streamed_turn(ctx, prompt, conv, rid, turn.max_tokens)
    return prompt + out, ttft, len(prompt)


def served_turns(log: Path) -> dict[str, dict[str, Any]]:
    """The router's JSON "Served turn" records by request id (its `reuse` is the outcome)."""
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("msg") == "Served turn":
            found[str(entry.get("request_id"))] = entry
    return found


def attach_outcomes(records: list[dict[str, Any]], served: dict[str, dict[str, Any]]) -> None:
    for rec in records:
        entry = served.get(rec["request_id"])
        if rec.get("outcome") != "error":
            rec["outcome"] = entry["reuse"] if entry else "unknown"
        if entry:
            rec.update({k: entry.get(k) for k in ("reused_tokens", "alone", "path", "chosen")})


def replay(ctx: dict[str, Any], plan: aw.Plan, scale: float, sampler: KvSampler) -> dict[str, Any]:
    """Run the whole plan with D sampled, and wait for D to free what the run retained."""
    before = {name: pdclient.scrape(ctx[name]) for name in ("router", "p", "d")}
    baseline = sampler.sample()
    sampler.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(len(plan.conversations), 1)) as pool:
        futures = [pool.submit(run_conversation, ctx, c, t0, scale) for c in plan.conversations]
        records = [rec for f in futures for rec in f.result()]
    ran_s = time.perf_counter() - t0
    sampler.drain(baseline, time.perf_counter() + ctx["ttl_s"] + 10.0)
    sampler.halt.set()
    sampler.join()
    after = {name: pdclient.scrape(ctx[name]) for name in ("router", "p", "d")}
    return {"records": records, "ran_s": ran_s, "before": before, "after": after, "t0": t0}


def moved(before: str, after: str, name: str, label: str) -> dict[str, float]:
    b, a = totals(before, name, label), totals(after, name, label)
    return {k: v - b.get(k, 0.0) for k, v in a.items() if v != b.get(k, 0.0)}


def result(
    args: argparse.Namespace, plan: aw.Plan, run: dict[str, Any], sampler: KvSampler
) -> dict[str, Any]:
    """The result file of one run: what ran, every turn, the summary, D's KV series."""
    area, bound = report.block_seconds(sampler.points)
    by_source = moved(run["before"]["p"], run["after"]["p"], BY_SOURCE, "source")
    d_source = moved(run["before"]["d"], run["after"]["d"], BY_SOURCE, "source")
    points = [(round(t - run["t0"], 2), round(u, 1)) for t, u in sampler.points]
    return {
        "label": args.label,
        "mode": args.mode,
        "api": args.api,
        "router_overrides": MODES[args.mode],
        "machine": args.header,
        "plan": plan.fingerprint(),
        "workload": plan.to_dict()["config"],
        "time_scale": args.time_scale,
        "decoder_ttl_s": args.ttl,
        "handle_ttl_s": args.handle_ttl,
        "plan_span_s": aw.span_s(plan) * args.time_scale,
        "replay_s": run["ran_s"],
        "summary": report.summarize(run["records"]),
        "router_reuse_moved": moved(
            run["before"]["router"],
            run["after"]["router"],
            "boomerang_router_reuse_total",
            "outcome",
        ),
        "p_tokens": {
            "pulled": by_source.get("external_kv_transfer", 0.0),
            "computed": by_source.get("local_compute", 0.0),
        },
        "d_tokens": {
            "from_cache": d_source.get("local_cache_hit", 0.0),
            "computed": d_source.get("local_compute", 0.0),
            "continued_suffixes": continued_suffixes(run["records"]),
        },
        "kv": {
            "block_s": area,
            "error_block_s": bound,
            "sample_interval_s": args.sample_s,
            "total_blocks": sampler.total,
            "peak_blocks": max((u for _t, u in sampler.points), default=0.0),
            "end_blocks": sampler.points[-1][1] if sampler.points else None,
            "samples": points,
        },
        "holds": [
            {"t": round(t - run["t0"], 2), "d_held": h, "router_leases": n, "retention_s": r}
            for t, h, n, r in sampler.holds
        ],
        "records": run["records"],
    }


def continued_suffixes(records: list[dict[str, Any]]) -> int:
    """The prompt tokens D had to compute for the turns continued on it, had its cache held
    every verified history it was sent (pinned or released): beside D's own `local_compute`
    count, what D computed beyond this is what its cache had evicted (or P/D turns' last
    partial block)."""
    return sum(
        r["prompt_tokens"] - (r.get("reused_tokens") or 0)
        for r in records
        if r.get("path") == "continue"
    )


def workload_config(args: argparse.Namespace) -> aw.WorkloadConfig:
    base = aw.QUICK if args.quick else aw.WorkloadConfig()
    cfg = dataclasses.replace(base, seed=args.seed)
    if args.conversations is not None:
        cfg = dataclasses.replace(cfg, conversations=args.conversations)
    return cfg


def start_stack(
    args: argparse.Namespace, plan: aw.Plan, run_dir: Path
) -> tuple[dict[str, Any], list[int]]:
    """P and D from the manifest, P's speed measured, one router in the chosen mode."""
    dd = manifest(args.ttl)
    venv = stack.ensure_engine_venv()
    args.header = f"machine: {machine.describe(venv)}"
    print(f"{args.header}\nlogs in {run_dir}", flush=True)
    ctx, pids = start_engines(dd, run_dir, venv)
    try:
        cost = calibrate.measure(ctx["p"], ctx["model"])
        longest = plan.config.max_context + plan.config.output_tokens[1]
        timeouts = calibrate.router_timeouts(cost, longest)
        reused, recomputed = aw.prefill_work_s(plan, cost.seconds)
        args.header += (
            f"\nprefill measured on P: {cost.rate(1024):.0f} tokens/s at 1024 tokens; the plan "
            f"needs about {reused / 60:.1f} min of P compute with every follow-up reused, "
            f"{recomputed / 60:.1f} min with none"
        )
        print(args.header, flush=True)
        overrides = {**scaled(MODES[args.mode], args.time_scale), "log_json": True}
        start_routers(dd, run_dir, ctx, timeouts, pids, {args.label: overrides})
    except BaseException:
        stop_all(pids)
        raise
    ctx.update(router=ctx[args.label], label=args.label, timeout=timeouts["decode_total_s"])
    ctx["api"] = args.api
    ctx["ttl_s"] = args.ttl
    args.handle_ttl = dd.spec.router_ttl_seconds
    return ctx, pids


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = aw.make_plan(workload_config(args))
    print(aw.describe(plan), flush=True)
    if args.dry_run:
        return {}
    run_dir = Path(tempfile.mkdtemp(prefix="boomerang-bench-agents-"))
    load_before = os.getloadavg()
    ctx, pids = start_stack(args, plan, run_dir)
    try:
        send_turn(ctx, [], aw.PlannedTurn(1, "first", 32, 0, 8, 0), "warmup", "warmup")
        token = stack.read_lease_token(run_dir)
        sampler = KvSampler(ctx["d"], args.sample_s, ctx["router"], token)
        run_ = replay(ctx, plan, args.time_scale, sampler)
    finally:
        stop_all(pids)
    attach_outcomes(run_["records"], served_turns(run_dir / f"{args.label}.log"))
    res = result(args, plan, run_, sampler)
    res["load_avg"] = {"before": load_before, "after": os.getloadavg()}
    return res


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--mode", default="static", choices=sorted(MODES), help="router mode")
    ap.add_argument(
        "--api",
        default="completions",
        choices=("completions", "responses"),
        help="token-id completions, or an agent's Responses API requests (responses.py)",
    )
    ap.add_argument("--label", help="name of this run in tables and file names (default: mode)")
    ap.add_argument("--quick", action="store_true", help="8 short conversations (~3 min)")
    ap.add_argument("--seed", type=int, default=aw.WorkloadConfig.seed)
    ap.add_argument("--conversations", type=int, help="override the plan's conversation count")
    ap.add_argument("--time-scale", type=float, help="think times x this (0.1; quick 0.0625)")
    ap.add_argument("--ttl", type=float, help="D's TTL, s (default 480 x time scale, min 30)")
    ap.add_argument("--sample-s", type=float, default=1.0, help="D's /metrics sampling period")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-chart", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="print the plan only; no engines")
    ap.add_argument("--compare", nargs="+", type=Path, help="tabulate result files side by side")
    args = ap.parse_args()
    api = "-responses" if args.api == "responses" else ""
    args.label = args.label or f"{args.mode}{api}" + ("-quick" if args.quick else "")
    if args.time_scale is None:
        args.time_scale = 0.0625 if args.quick else 0.1
    if args.ttl is None:
        args.ttl = max(MIN_TTL_S, round(REAL_TTL_S * args.time_scale))
    if args.ttl < MIN_TTL_S:
        ap.error(f"--ttl must be at least {MIN_TTL_S:.0f} s")
    return args


def main() -> None:
    args = parse_args()
    if args.compare:
        results = [json.loads(p.read_text()) for p in args.compare]
        print(report.format_table(results))
        if not args.no_chart:
            report.draw(results, args.out / "agents-compare.png")
        return
    res = run(args)
    if not res:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"agents-{args.label}.json").write_text(json.dumps(res, indent=1))
    if not args.no_chart:
        report.draw([res], args.out / f"agents-{args.label}.png")
    print(f"{res['machine']}\n{aw.describe(aw.make_plan(workload_config(args)))}")
    print(conditions(res))
    print(report.format_table([res]))


def conditions(res: dict[str, Any]) -> str:
    """The line that says under which scale, TTLs and load the numbers were measured."""
    scale, load = res["time_scale"], res["load_avg"]
    d_ttl, handle_ttl = res["decoder_ttl_s"], res["handle_ttl_s"]
    return (
        f"mode {res['mode']}, time scale {scale}: D's TTL {d_ttl:.0f} s and the router's "
        f"handle TTL {handle_ttl:.0f} s (as {d_ttl / scale:.0f} s and {handle_ttl / scale:.0f} s "
        "of unscaled think time); replay "
        f"{res['replay_s']:.0f} s; load average {load['before'][0]:.1f} before, "
        f"{load['after'][0]:.1f} after; D sampled every {res['kv']['sample_interval_s']} s"
    )


if __name__ == "__main__":
    main()
