"""TTFT of turn N+1 against history length, with KV reuse on and off: the headline figure.

Starts a real P/D pair (vLLM CPU build, NIXL) serving the larger builtin model
(`builtin://small`, 116M parameters), plus two routers: one with reuse on and one with reuse
off (it never attaches D's params, so P recomputes the history). For each history length it
runs two-turn conversations and times the second turn four ways:

- router, reuse on / router, reuse off: what clients see;
- direct, reuse on / direct, P recomputes: the engines driven by `pdclient` with no router,
  the reference for how much of the gain the router keeps.

It prints a table, writes it as JSON, and draws two PNG charts: TTFT against history length
(on vs off), and the prefill time split into KV transfer and recompute.

    make bench-ttft                  # ~10 minutes, into e2e/bench/results
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boomerang.local import calibrate, pdclient, stack
from boomerang.local.engine_client import samples

from bench.harness import charts, machine
from bench.harness.pair import bench_manifest, rotated, start_engines, start_routers, stop_all
from bench.harness.repo import RESULTS

NEW_TOKENS = 64
MAX_TOKENS = 8
MODES = ("router_on", "router_off", "direct_on", "direct_off")


@dataclass
class Sample:
    mode: str
    history: int
    ttft_s: float
    prefill_s: float
    xfer_s: float
    external_tokens: float
    p_engine_s: float
    """P's own time to its one token, as vLLM measures it (queue, KV pull, compute)."""
    d_engine_s: float
    """D's own time to first token, as vLLM measures it."""

    @property
    def outside_s(self) -> float:
        """TTFT not spent inside the engines: HTTP hops, the API servers' parsing, the router."""
        return self.ttft_s - self.p_engine_s - self.d_engine_s


def histogram_sum(metrics: str, name: str) -> float:
    """The `_sum` of one vLLM histogram (summed over its label sets)."""
    return sum(sample.value for sample in samples(metrics, f"vllm:{name}_sum"))


def router_ttft(router: str, model: str, prompt: list[int], conv: str, timeout: float) -> float:
    body = {**pdclient.completion_body(model, prompt, MAX_TOKENS), "stream": True}
    body["conversation_id"] = conv
    start = time.perf_counter()
    for arrived, chunk in pdclient.stream_events(f"{router}/v1/completions", body, timeout):
        if any(c.get("token_ids") or c.get("text") for c in chunk.get("choices", [])):
            return float(arrived - start)
    raise RuntimeError("no token streamed")


def measure(
    ctx: dict[str, Any], fn: Callable[[], tuple[float, float]], mode: str, hist: int
) -> Sample:
    """Run one timed turn, with P's and D's metrics before and after.

    The engines' own TTFT histograms split the client's TTFT into time inside P, time inside
    D, and the rest (HTTP hops and the router): that is what tells a slower P apart from a
    router that adds time."""
    p_before, d_before = pdclient.scrape(ctx["p"]), pdclient.scrape(ctx["d"])
    ttft, prefill = fn()
    p_after, d_after = pdclient.scrape(ctx["p"]), pdclient.scrape(ctx["d"])

    def grew(before: str, after: str, name: str) -> float:
        return histogram_sum(after, name) - histogram_sum(before, name)

    return Sample(
        mode,
        hist,
        ttft,
        prefill,
        xfer_s=grew(p_before, p_after, "nixl_xfer_time_seconds"),
        external_tokens=pdclient.external_tokens(p_after) - pdclient.external_tokens(p_before),
        p_engine_s=grew(p_before, p_after, "time_to_first_token_seconds"),
        d_engine_s=grew(d_before, d_after, "time_to_first_token_seconds"),
    )


def one_conversation(ctx: dict[str, Any], mode: str, hist: int, rng: random.Random) -> Sample:
    model, p, d, limit = ctx["model"], ctx["p"], ctx["d"], ctx["timeout"]
    history = [rng.randrange(16, 8000) for _ in range(hist)]
    conv = f"{mode}-{hist}-{rng.randrange(1 << 30)}"
    if mode.startswith("router"):
        router = ctx[mode]
        body = {**pdclient.completion_body(model, history, MAX_TOKENS), "conversation_id": conv}
        resp = pdclient.post(f"{router}/v1/completions", body, limit)
        prompt = history + resp["choices"][0]["token_ids"] + fresh(rng)

        def timed_router() -> tuple[float, float]:
            return router_ttft(router, model, prompt, conv, limit), 0.0

        return measure(ctx, timed_router, mode, hist)
    first = pdclient.pd_turn(p, d, model, history, None, MAX_TOKENS, limit)
    prompt = history + first.tokens + fresh(rng)
    handle = first.handle if mode == "direct_on" else None

    def timed_direct() -> tuple[float, float]:
        turn = pdclient.pd_turn(p, d, model, prompt, handle, MAX_TOKENS, limit)
        return turn.ttft_s, turn.prefill_s

    return measure(ctx, timed_direct, mode, hist)


def fresh(rng: random.Random) -> list[int]:
    """The next turn's new tokens."""
    return [rng.randrange(16, 8000) for _ in range(NEW_TOKENS)]


def plan(
    histories: list[int], reps: int, cost: calibrate.PrefillCost, budget_s: float
) -> tuple[list[int], list[str]]:
    """The histories that fit the time budget on this machine, and a note per one left out.

    Each conversation computes its history once on turn 1, and the two recompute modes compute
    it again on turn 2: per history about `reps * 6` full prefills."""
    kept, notes, total = [], [], 0.0
    for hist in sorted(histories):
        need = reps * 6 * cost.seconds(hist + NEW_TOKENS)
        if total + need > budget_s:
            notes.append(
                f"left out {hist}: about {need / 60:.0f} more minutes on this machine "
                f"(budget {budget_s / 60:.0f} min, --budget-min to change)"
            )
            continue
        kept.append(hist)
        total += need
    return kept, notes


def summarize(samples: list[Sample]) -> list[dict[str, Any]]:
    rows = []
    for hist in sorted({s.history for s in samples}):
        row: dict[str, Any] = {"history": hist}
        for mode in MODES:
            these = [s for s in samples if s.history == hist and s.mode == mode]
            if these:
                row[mode] = statistics.median(s.ttft_s for s in these)
                row[f"{mode}_prefill"] = statistics.median(s.prefill_s for s in these)
                row[f"{mode}_xfer"] = statistics.median(s.xfer_s for s in these)
                row[f"{mode}_external"] = statistics.median(s.external_tokens for s in these)
                row[f"{mode}_p_engine"] = statistics.median(s.p_engine_s for s in these)
                row[f"{mode}_outside"] = statistics.median(s.outside_s for s in these)
        rows.append(derive(row))
    return rows


def derive(row: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios of one history length.

    The router keeps `(direct_off - router_on) / (direct_off - direct_on)` of the gain: both
    terms share the same recompute baseline, so what is measured is the latency the router adds
    on the reuse path, not the run-to-run noise of two separate multi-second recomputes (the
    router-off column is that noise plus the router's small overhead)."""
    gain_direct = row["direct_off"] - row["direct_on"]
    row["ratio_on_off"] = row["router_on"] / row["router_off"]
    row["router_overhead"] = row["router_on"] - row["direct_on"]
    row["router_keeps"] = (
        (row["direct_off"] - row["router_on"]) / gain_direct if gain_direct > 0 else float("nan")
    )
    return row


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| history | router on | router off | on/off | direct on | direct, P recomputes "
        "| router adds | router keeps | tokens pulled | P's own time, router / direct "
        "| outside the engines, router / direct |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    nan = float("nan")
    for r in rows:
        lines.append(
            f"| {r['history']} | {r['router_on'] * 1000:.0f} ms | {r['router_off'] * 1000:.0f} ms "
            f"| {r['ratio_on_off']:.2f} | {r['direct_on'] * 1000:.0f} ms "
            f"| {r['direct_off'] * 1000:.0f} ms | {r['router_overhead'] * 1000:+.0f} ms "
            f"| {r['router_keeps'] * 100:.0f}% "
            f"| {r['direct_on_external']:.0f} "
            f"| {r.get('router_on_p_engine', nan) * 1000:.0f} / "
            f"{r.get('direct_on_p_engine', nan) * 1000:.0f} ms "
            f"| {r.get('router_on_outside', nan) * 1000:.0f} / "
            f"{r.get('direct_on_outside', nan) * 1000:.0f} ms |"
        )
    return "\n".join(lines)


def draw(rows: list[dict[str, Any]], out: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = [r["history"] for r in rows]
    styles = {
        "router_on": ("Router, reuse on", "o-"),
        "router_off": ("Router, reuse off", "s-"),
        "direct_on": ("Direct P/D, reuse on", "o--"),
        "direct_off": ("Direct P/D, P recomputes", "s--"),
    }
    charts.lines(
        out / "ttft_vs_history.png",
        hist,
        {label: ([r[mode] * 1000 for r in rows], style) for mode, (label, style) in styles.items()},
        xlabel="history length (tokens)",
        ylabel="TTFT of the next turn (ms)",
        title=f"Turn N+1 TTFT, vLLM CPU P/D, {model} model",
    )

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    x = list(range(len(rows)))
    xfer = [r["direct_on_xfer"] * 1000 for r in rows]
    rest = [max(r["direct_on_prefill"] * 1000 - t, 0.0) for r, t in zip(rows, xfer, strict=True)]
    recompute = [r["direct_off_prefill"] * 1000 for r in rows]
    w = 0.27
    bars = (
        (-w, xfer, "reuse on: KV transfer D→P (NIXL read)"),
        (0.0, rest, "reuse on: rest of P's turn (new tokens, scheduling)"),
        (w, recompute, "reuse off: P recomputes the history"),
    )
    for offset, values, label in bars:
        drawn = ax.bar([i + offset for i in x], values, w, label=label)
        ax.bar_label(drawn, fmt="%.0f", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(x, [str(h) for h in hist])
    ax.set_xlabel("history length (tokens)")
    ax.set_ylabel("time on P for the next turn (ms, log scale)")
    ax.set_title("Prefill time: KV transfer vs recompute")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "prefill_split.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small", choices=["tiny", "small"])
    ap.add_argument("--histories", default="1024,2048,4096,8192")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--budget-min",
        type=float,
        default=90.0,
        help="leave out the longest histories whose estimated time (from P's measured prefill "
        "speed) would exceed this many minutes",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--replot", action="store_true", help="redraw from OUT/ttft.json only")
    args = ap.parse_args()
    if args.replot:
        rows = [derive(r) for r in json.loads((args.out / "ttft.json").read_text())]
        draw(rows, args.out, args.model)
        print(format_table(rows))
        return
    dd = bench_manifest(args.model)
    venv = stack.ensure_engine_venv()
    run_dir = Path(tempfile.mkdtemp(prefix="boomerang-bench-"))
    header = f"machine: {machine.describe(venv)}"
    print(f"{header}\nlogs in {run_dir}", flush=True)
    ctx, pids = start_engines(dd, run_dir, venv)
    rng = random.Random(2026)
    samples: list[Sample] = []
    try:
        ctx["timeout"] = 3600.0
        one_conversation(ctx, "direct_on", 256, rng)  # warm-up: first requests are slow
        # Measured now, with D holding the warm-up's blocks as it will all run (its worker then
        # spins and P gets less of the machine than on an idle one).
        cost = calibrate.measure(ctx["p"], ctx["model"])
        histories, notes = plan(
            [int(h) for h in args.histories.split(",")], args.reps, cost, args.budget_min * 60
        )
        longest = max(histories, default=1024) + NEW_TOKENS + MAX_TOKENS
        timeouts = calibrate.router_timeouts(cost, longest)
        ctx["timeout"] = timeouts["decode_total_s"]
        header += (
            f"\nprefill measured on P: {cost.rate(1024):.0f} tokens/s at 1024 tokens; "
            f"timeouts {timeouts['prefill_s']:.0f}s (prefill) for {longest}-token prompts"
        )
        header += "".join(f"\n{note}" for note in notes)
        print(header, flush=True)
        start_routers(dd, run_dir, ctx, timeouts, pids)
        one_conversation(ctx, "router_on", 256, rng)
        for hist, mode in rotated(histories, args.reps, MODES):
            s = one_conversation(ctx, mode, hist, rng)
            samples.append(s)
            print(
                f"{mode:>10} {hist:>5}: TTFT {s.ttft_s * 1000:7.0f} ms, inside P "
                f"{s.p_engine_s * 1000:6.0f} ms, inside D {s.d_engine_s * 1000:5.0f} ms",
                flush=True,
            )
    finally:
        stop_all(pids)
    rows = summarize(samples)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ttft.json").write_text(json.dumps(rows, indent=2))
    (args.out / "ttft-machine.txt").write_text(header + "\n")
    draw(rows, args.out, args.model)
    print(header)
    print(format_table(rows))


if __name__ == "__main__":
    main()
