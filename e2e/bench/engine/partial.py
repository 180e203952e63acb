"""Turn-2 TTFT of a thinking model's conversation: all-or-nothing reuse against partial reuse.

The chat templates of Qwen3 and GLM drop an earlier turn's reasoning from the next prompt, so
the ids D generated (reasoning included) are never a prefix of that prompt: with all-or-nothing
reuse every such turn is rejected and P recomputes the whole history. Partial reuse pulls the
whole blocks of the common prefix (the history up to the reply) and computes the rest.

The builtin model's template drops reasoning the way Qwen3's does. Each conversation: turn 1
is a long system prompt (the history), a question, and an assistant turn the client prefilled
with reasoning (`continue_final_message`), so D's held ids end inside `<think>...</think>` +
answer; turn 2 sends the whole reply back with a new question, and is timed through two
routers on the same engines: partial reuse on ("partial") and off ("rejected", the behaviour
before partial reuse). P's own counters say how many prompt tokens it pulled and computed.

    make bench-partial              # into e2e/bench/results
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from boomerang.local import calibrate, pdclient, stack

from bench.harness import machine
from bench.harness.pair import bench_manifest, rotated, start_engines, start_routers, stop_all
from bench.harness.repo import RESULTS

MODES = {"partial": {"partial_reuse": True}, "rejected": {"partial_reuse": False}}
THINK = "<think>" + "First I weigh each option against the others carefully. " * 16 + "</think>\n"
SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "xe", "zo", "pa", "qu")


def prose(rng: random.Random, words: int) -> str:
    """Unique text (no engine's prefix cache can help), about 1.3 tokens a word here."""
    return " ".join(
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(words)
    )


def history_messages(ctx: dict[str, Any], tokens: int, rng: random.Random) -> list[Any]:
    """A system prompt of about `tokens` tokens, a question, and a prefilled reasoning turn."""
    probe = prose(rng, 400)
    per_word = len(tokenize(ctx, [{"role": "user", "content": probe}])) / 400
    return [
        {"role": "system", "content": prose(rng, int(tokens / per_word))},
        {"role": "user", "content": "Which way should the boomerang fly? " + prose(rng, 20)},
        {"role": "assistant", "content": THINK},
    ]


def tokenize(ctx: dict[str, Any], messages: list[Any]) -> list[int]:
    body = {"model": ctx["model"], "messages": messages}
    return list(pdclient.post(f"{ctx['p']}/tokenize", body)["tokens"])


def chat_body(ctx: dict[str, Any], messages: list[Any], conv: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": ctx["model"],
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0.0,
        "conversation_id": conv,
        **extra,
    }


def timed_turn(
    ctx: dict[str, Any], router: str, body: dict[str, Any]
) -> tuple[float, dict[str, float]]:
    """Streamed TTFT through `router`, and P's token sources moved by the turn."""
    before = pdclient.tokens_by_source(pdclient.scrape(ctx["p"]))
    start = time.perf_counter()
    ttft = None
    for arrived, chunk in pdclient.stream_events(
        f"{router}/v1/chat/completions", {**body, "stream": True}, ctx["timeout"]
    ):
        if ttft is None and any((c.get("delta") or {}).get("content") for c in chunk["choices"]):
            ttft = arrived - start
    after = pdclient.tokens_by_source(pdclient.scrape(ctx["p"]))
    moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return (ttft if ttft is not None else time.perf_counter() - start), moved


def conversation(ctx: dict[str, Any], mode: str, tokens: int, rng: random.Random) -> dict[str, Any]:
    router = ctx[mode]
    conv = f"{mode}-{tokens}-{rng.randrange(1 << 30)}"
    messages = history_messages(ctx, tokens, rng)
    prefilled = {"continue_final_message": True, "add_generation_prompt": False}
    first = pdclient.post(
        f"{router}/v1/chat/completions", chat_body(ctx, messages, conv, **prefilled), ctx["timeout"]
    )
    answer = first["choices"][0]["message"]["content"]
    messages[-1] = {"role": "assistant", "content": THINK + answer}
    messages.append({"role": "user", "content": "And on the way back? " + prose(rng, 40)})
    ttft, moved = timed_turn(ctx, router, chat_body(ctx, messages, conv))
    return {
        "mode": mode,
        "history": tokens,
        "prompt": len(tokenize(ctx, messages)),
        "ttft_s": ttft,
        "pulled": moved.get("external_kv_transfer", 0.0),
        "computed": moved.get("local_compute", 0.0),
    }


def summarize(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for hist in sorted({s["history"] for s in samples}):
        row: dict[str, Any] = {"history": hist}
        for mode in MODES:
            these = [s for s in samples if s["history"] == hist and s["mode"] == mode]
            for key in ("prompt", "ttft_s", "pulled", "computed"):
                row[f"{mode}_{key}"] = statistics.median(s[key] for s in these)
        row["ratio"] = row["partial_ttft_s"] / row["rejected_ttft_s"]
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| history | prompt tokens | rejected (all-or-nothing) TTFT | partial reuse TTFT "
        "| partial / rejected | partial: pulled / computed | rejected: computed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['history']} | {r['partial_prompt']:.0f} | {r['rejected_ttft_s'] * 1000:.0f} ms "
            f"| {r['partial_ttft_s'] * 1000:.0f} ms | {r['ratio']:.2f} "
            f"| {r['partial_pulled']:.0f} / {r['partial_computed']:.0f} "
            f"| {r['rejected_computed']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--histories", default="4096,8192")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    dd = bench_manifest(args.model)
    venv = stack.ensure_engine_venv()
    run_dir = Path(tempfile.mkdtemp(prefix="boomerang-bench-partial-"))
    header = f"machine: {machine.describe(venv)}"
    print(f"{header}\nlogs in {run_dir}", flush=True)
    ctx, pids = start_engines(dd, run_dir, venv)
    histories = [int(h) for h in args.histories.split(",")]
    rng = random.Random(2027)
    samples = []
    try:
        cost = calibrate.measure(ctx["p"], ctx["model"])
        timeouts = calibrate.router_timeouts(cost, max(histories) + 1024)
        ctx["timeout"] = timeouts["decode_total_s"]
        start_routers(dd, run_dir, ctx, timeouts, pids, MODES)
        conversation(ctx, "partial", 512, rng)  # warm-up: the first pull sets up NIXL
        for hist, mode in rotated(histories, args.reps, list(MODES)):
            s = conversation(ctx, mode, hist, rng)
            samples.append(s)
            print(
                f"{mode:>9} {hist:>5}: TTFT {s['ttft_s'] * 1000:7.0f} ms, pulled "
                f"{s['pulled']:.0f}, computed {s['computed']:.0f}",
                flush=True,
            )
    finally:
        stop_all(pids)
    rows = summarize(samples)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "partial.json").write_text(json.dumps({"machine": header, "rows": rows}, indent=2))
    print(header)
    print(format_table(rows))


if __name__ == "__main__":
    main()
