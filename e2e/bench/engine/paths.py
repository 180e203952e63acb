"""TTFT of the three paths a turn can take, and what the adaptive router makes of them.

Issue 12's per-turn figure: for a turn that appends a suffix to a history D holds, what does
each path cost, and does the adaptive router pick well? On a real P/D pair (vLLM CPU build,
NIXL) it builds, per suffix size and repetition, a fresh conversation of `--history` tokens
(turn 1 through P then D), then times turn 2 four ways, in a rotating order:

- pull: P pulls the history from D and computes the suffix, then D (today's flow, direct);
- recompute: P computes the whole prompt, then D (direct, no handle);
- continue: the turn goes straight to D with empty KV-transfer intent; D serves the history
  from its own cache and computes the suffix (direct);
- adaptive: through a router in adaptive mode, which chooses per turn (the path it took is
  read from its `boomerang_router_path_total`).

It also measures what the continue path costs D's other streams: while D streams a long
answer for another request, a continue turn of each suffix size arrives; the background
stream's longest gap between tokens during that turn, minus its median gap before it, is the
inter-token latency the suffix cost (the figure the ITL budget bounds).

Ratios are what compare across machines: the table prints adaptive / pull and adaptive / the
better of pull and recompute per suffix size, beside the issue's targets.

    make bench-paths                                 # ~10 minutes on 2 cores (tiny model)
    make bench-paths ARGS="--suffixes 16,256 --reps 2"
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from boomerang.local import calibrate, pdclient, stack
from boomerang.local.engine_client import samples

from bench.harness import charts, machine
from bench.harness.pair import rotation, start_engines, start_routers, stop_all
from bench.harness.repo import REPO, RESULTS

PORTS = stack.LocalPorts(
    router=29080, prefill=29100, decode=29200, prefill_side_channel=26600, decode_side_channel=26700
)
ON_DECODE = {"do_remote_prefill": False, "do_remote_decode": False}
"""A request D serves itself: no pull from P, and (bidirectional on) its blocks retained."""
MAX_TOKENS = 8
PATHS = ("pull", "recompute", "continue", "adaptive")
ITL_BUDGET_S = 0.5
"""The continue path's ITL budget on this CPU engine: a 256-token suffix costs D's other streams
about 270 ms here (this benchmark's ITL column); a GPU engine's budget is tens of ms (the
router's default, 50 ms)."""
ADAPTIVE = {"tuning": {"mode": "adaptive", "itl_budget_s": ITL_BUDGET_S}}
"""The router's overrides for the adaptive run: its defaults otherwise."""
TARGET_SHORT = 0.5
"""Issue 12: a suffix of at most 256 tokens on a 4k history at most half the pull path's TTFT."""
SHORT_SUFFIX = 256
TARGET_ANY = 1.10
"""...and in no suffix bucket more than 10 % slower than the better of pull and recompute."""


@dataclass
class Row:
    suffix: int
    ttft: dict[str, list[float]] = field(default_factory=dict)
    paths: dict[str, int] = field(default_factory=dict)
    itl_extra_s: list[float] = field(default_factory=list)
    mismatches: int = 0


def manifest(model: str, ttl: str) -> Any:
    """examples/local-cpu.yaml with the chosen builtin model, room in D's cache, a short TTL."""
    from boomerang.operator.api import DisaggregatedDeployment

    data = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    spec = data["spec"]
    spec["model"].update(source=f"builtin://{model}", servedName=f"boomerang-{model}")
    spec["kvTransfer"]["decoderBlocksTTL"] = ttl
    for var in spec["engine"]["env"]:
        if var["name"] == "VLLM_CPU_KVCACHE_SPACE":
            var["value"] = "3"
    return DisaggregatedDeployment.model_validate(data)


def continue_turn(d_url: str, model: str, prompt: list[int], timeout: float) -> pdclient.Turn:
    """Turn 2 straight to D, which holds the history (streamed: TTFT is the first token)."""
    start = time.perf_counter()
    body = {**pdclient.completion_body(model, prompt, MAX_TOKENS), "stream": True}
    body["kv_transfer_params"] = dict(ON_DECODE)
    turn = pdclient.Turn(prompt=prompt, tokens=[], logprobs=[], ttft_s=0.0, prefill_s=0.0)
    for arrived, chunk in pdclient.stream_events(f"{d_url}/v1/completions", body, timeout):
        for choice in chunk.get("choices", []):
            ids = choice.get("token_ids") or []
            if ids and not turn.tokens:
                turn.ttft_s = arrived - start
            turn.tokens += ids
    return turn


def router_turn(router: str, model: str, prompt: list[int], conv: str, timeout: float) -> Any:
    """(TTFT, tokens) of one streamed turn through the router."""
    body = {**pdclient.completion_body(model, prompt, MAX_TOKENS), "stream": True}
    body["conversation_id"] = conv
    start, ttft, tokens = time.perf_counter(), 0.0, []
    for arrived, chunk in pdclient.stream_events(f"{router}/v1/completions", body, timeout):
        for choice in chunk.get("choices", []):
            ids = choice.get("token_ids") or []
            if ids and not tokens:
                ttft = arrived - start
            tokens += ids
    return ttft, tokens


def path_counts(router: str) -> dict[str, float]:
    """The router's `boomerang_router_path_total` by path."""
    text = pdclient.scrape(router)
    return {s.labels["path"]: s.value for s in samples(text, "boomerang_router_path_total")}


def fresh(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(16, 8000) for _ in range(n)]


def one(ctx: dict[str, Any], path: str, hist: int, suffix: int, rng: random.Random) -> Any:
    """(TTFT, path taken, tokens, prompt) of turn 2 of a fresh conversation on `path`."""
    model, p, d, limit = ctx["model"], ctx["p"], ctx["d"], ctx["timeout"]
    history = fresh(rng, hist)
    if path == "adaptive":
        router, conv = ctx["adaptive"], f"paths-{rng.randrange(1 << 40)}"
        first = pdclient.post(
            f"{router}/v1/completions",
            {**pdclient.completion_body(model, history, MAX_TOKENS), "conversation_id": conv},
            limit,
        )
        prompt = history + first["choices"][0]["token_ids"] + fresh(rng, suffix)
        before = path_counts(router)
        ttft, tokens = router_turn(router, model, prompt, conv, limit)
        after = path_counts(router)
        taken = [k for k in after if after[k] > before.get(k, 0.0)]
        return ttft, (taken[0] if len(taken) == 1 else "?"), tokens, prompt
    turn1 = pdclient.pd_turn(p, d, model, history, None, MAX_TOKENS, limit)
    prompt = history + turn1.tokens + fresh(rng, suffix)
    if path == "continue":
        turn = continue_turn(d, model, prompt, limit)
    else:
        handle = turn1.handle if path == "pull" else None
        turn = pdclient.pd_turn(p, d, model, prompt, handle, MAX_TOKENS, limit)
    return turn.ttft_s, path, turn.tokens, prompt


def itl_extra(ctx: dict[str, Any], hist: int, suffix: int, rng: random.Random) -> float:
    """How much longer D's other stream waited for a token while D computed `suffix` tokens
    of a continue turn: the longest gap during the turn minus the median gap before it."""
    model, p, d, limit = ctx["model"], ctx["p"], ctx["d"], ctx["timeout"]
    history = fresh(rng, hist)
    turn1 = pdclient.pd_turn(p, d, model, history, None, MAX_TOKENS, limit)
    prompt = history + turn1.tokens + fresh(rng, suffix)
    arrivals: list[float] = []
    started = threading.Event()

    def background() -> None:
        bg_prompt = fresh(rng, 64)
        p_body = {**pdclient.completion_body(model, bg_prompt, 1), "stream": False}
        p_body["kv_transfer_params"] = dict(pdclient.FRESH)
        p_resp = pdclient.post(f"{p}/v1/completions", p_body, limit)
        body = {**pdclient.completion_body(model, bg_prompt, 400), "stream": True}
        body["kv_transfer_params"] = p_resp["kv_transfer_params"]
        body["ignore_eos"] = True
        for arrived, _ in pdclient.stream_events(f"{d}/v1/completions", body, limit):
            arrivals.append(arrived)
            if len(arrivals) == 40:
                started.set()

    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    if not started.wait(limit):
        raise RuntimeError("the background stream did not start")
    t0 = time.perf_counter()
    turn = continue_turn(d, model, prompt, limit)
    t1 = t0 + turn.ttft_s
    thread.join(limit)
    gaps_before = [b - a for a, b in itertools.pairwise(arrivals) if b < t0]
    during = [b - a for a, b in itertools.pairwise(arrivals) if b >= t0 and a <= t1]
    if not gaps_before or not during:
        return 0.0
    return max(during) - statistics.median(gaps_before)


def run(ctx: dict[str, Any], args: argparse.Namespace, log: Callable[[str], None]) -> list[Row]:
    rng = random.Random(args.seed)
    rows = [Row(s) for s in args.suffixes]
    for row in rows:
        for rep in range(args.reps):
            for path in rotation(PATHS, rep):
                ttft, taken, tokens, prompt = one(ctx, path, args.history, row.suffix, rng)
                reference = pdclient.single_turn(ctx["p"], ctx["model"], prompt, MAX_TOKENS)
                row.mismatches += tokens != reference.tokens
                row.ttft.setdefault(path, []).append(ttft)
                if path == "adaptive":
                    row.paths[taken] = row.paths.get(taken, 0) + 1
                log(f"suffix {row.suffix:>5} {path:>9}: TTFT {ttft * 1000:7.1f} ms ({taken})")
            row.itl_extra_s.append(itl_extra(ctx, args.history, row.suffix, rng))
            log(f"suffix {row.suffix:>5}  ITL extra {row.itl_extra_s[-1] * 1000:7.1f} ms")
    return rows


def summarize(rows: list[Row]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        med = {path: statistics.median(v) for path, v in row.ttft.items()}
        best = min(med["pull"], med["recompute"])
        out.append(
            {
                "suffix": row.suffix,
                **{f"{p}_ms": med[p] * 1000 for p in PATHS},
                "adaptive_paths": row.paths,
                "adaptive_vs_pull": med["adaptive"] / med["pull"],
                "adaptive_vs_best": med["adaptive"] / best,
                "continue_vs_pull": med["continue"] / med["pull"],
                "itl_extra_ms": statistics.median(row.itl_extra_s) * 1000,
                "mismatches": row.mismatches,
            }
        )
    return out


def verdict(row: dict[str, Any]) -> str:
    ok = row["adaptive_vs_best"] <= TARGET_ANY
    if row["suffix"] <= SHORT_SUFFIX:
        ok = ok and row["adaptive_vs_pull"] <= TARGET_SHORT
    return "met" if ok and row["mismatches"] == 0 else "NOT met"


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| suffix | pull ms | recompute ms | continue ms | adaptive ms | adaptive took | "
        "adaptive/pull | adaptive/best | D's ITL extra ms | outputs differ | target |\n"
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"
    )
    lines = [head]
    for r in rows:
        took = ", ".join(f"{k} {v}" for k, v in sorted(r["adaptive_paths"].items()))
        lines.append(
            f"| {r['suffix']} | {r['pull_ms']:.0f} | {r['recompute_ms']:.0f} | "
            f"{r['continue_ms']:.0f} | {r['adaptive_ms']:.0f} | {took} | "
            f"{r['adaptive_vs_pull']:.2f} | {r['adaptive_vs_best']:.2f} | "
            f"{r['itl_extra_ms']:.1f} | {r['mismatches']} | {verdict(r)} |"
        )
    return "\n".join(lines)


def draw(rows: list[dict[str, Any]], out: Path, history: int) -> None:
    """TTFT per suffix size for each path, log-log: where each path wins, and adaptive's pick."""
    styles = {
        "pull": ("pull (P pulls the history)", "s--"),
        "recompute": ("recompute (P computes all)", "^--"),
        "continue": ("continue on D (no P)", "o--"),
        "adaptive": ("adaptive router (its choice)", "D-"),
    }
    charts.lines(
        out / "paths_ttft.png",
        [r["suffix"] for r in rows],
        {
            label: ([r[f"{path}_ms"] for r in rows], style)
            for path, (label, style) in styles.items()
        },
        xlabel="new suffix (tokens)",
        ylabel="TTFT of the turn (ms, log scale)",
        title=f"Three paths after a {history}-token history, vLLM CPU P/D",
        log=True,
    )


def warm_up(ctx: dict[str, Any], args: argparse.Namespace, log: Callable[[str], None]) -> None:
    """First requests are slow, and the adaptive router learns its coefficients from turns it
    serves: a few conversations of every suffix size through it before anything is timed."""
    rng = random.Random(args.seed + 1)
    one(ctx, "pull", 256, 16, rng)
    for _ in range(args.warmup):
        for suffix in args.suffixes:
            one(ctx, "adaptive", args.history, suffix, rng)
    log(f"warm-up done: router paths so far {path_counts(ctx['adaptive'])}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--history", type=int, default=4096)
    ap.add_argument("--suffixes", default="16,64,256,1024,2048")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="adaptive conversations per suffix")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--ttl", default="60s", help="D's decoder TTL for the run")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--replot", action="store_true", help="redraw and print from OUT/paths.json")
    args = ap.parse_args()
    args.suffixes = [int(s) for s in str(args.suffixes).split(",")]
    return args


def main() -> None:
    args = parse_args()
    if args.replot:
        saved = json.loads((args.out / "paths.json").read_text())
        draw(saved["rows"], args.out, args.history)
        print(saved["header"])
        print(format_table(saved["rows"]))
        return
    dd = manifest(args.model, args.ttl)
    venv = stack.ensure_engine_venv()
    run_dir = Path(tempfile.mkdtemp(prefix="boomerang-paths-"))
    header = f"machine: {machine.describe(venv)}"
    print(f"{header}\nlogs in {run_dir}", flush=True)
    ctx, pids = start_engines(dd, run_dir, venv, PORTS)
    try:
        ctx["timeout"] = 600.0
        cost = calibrate.measure(ctx["p"], ctx["model"])
        longest = args.history + max(args.suffixes) + 2 * MAX_TOKENS
        timeouts = calibrate.router_timeouts(cost, longest)
        ctx["timeout"] = timeouts["decode_total_s"]
        header += f"\nprefill measured on P: {cost.rate(1024):.0f} tokens/s at 1024 tokens"
        header += f"\nhistory {args.history} tokens, model {args.model}, {args.reps} reps"
        print(header, flush=True)
        start_routers(dd, run_dir, ctx, timeouts, pids, {"adaptive": ADAPTIVE}, ports=PORTS)
        warm_up(ctx, args, lambda line: print(line, flush=True))
        rows = summarize(run(ctx, args, lambda line: print(line, flush=True)))
    finally:
        stop_all(pids)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paths.json").write_text(json.dumps({"header": header, "rows": rows}, indent=2))
    draw(rows, args.out, args.history)
    print(header)
    print(format_table(rows))


if __name__ == "__main__":
    main()
