"""`boomerang demo`: a short multi-turn chat through the local stack, and what reuse bought.

One screen should tell a newcomer what bidirectional reuse does, so every timed turn is run
twice through the router with the official client:
- **with reuse**: the conversation as a client sends it; from turn 2 the router finds the
  decoder's handle and P pulls the history back from D;
- **recomputed**: the very same messages sent once more. The first send consumed the handle
  (handles are single-use), so nothing is reusable and P computes the whole prompt, which is
  what every turn costs without reuse (the local stack's P runs without a prefix cache).
For each, the prefill engines' own `prompt_tokens_by_source` counters (summed over every
prefill replica: the router picks one per turn) say how many prompt tokens P pulled from D and
how many it computed, and the router's `reuse_total{outcome}` counter says what the
router decided. A warm-up conversation runs first and is not shown: the first pull between two
engines pays NIXL's one-time connection set-up, which no later turn pays.
"""

from __future__ import annotations

import statistics
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from boomerang.local.engine_client import tokens_by_source, totals

QUESTIONS = [
    "Tell me a story about a boomerang that always comes back with more than it took.",
    "Now retell it from the point of view of the tree it hit on the way.",
    "Summarise both versions in three sentences, then suggest a title.",
    "Translate the title into a pirate's dialect and explain the joke.",
]
SYSTEM = "You are a helpful assistant who answers at length. " * 60
WARMUP = "You are a terse assistant who answers in one line. " * 60
"""As long as SYSTEM but different text, so no engine's prefix cache holds the demo's turns."""
MAX_TOKENS = 32


@dataclass(frozen=True)
class Send:
    """One request as the client and the engines saw it."""

    ttft_s: float
    total_s: float
    prompt_tokens: int
    reuse: str
    pulled: int
    """Prompt tokens P pulled from D (P's `external_kv_transfer`)."""
    computed: int
    """Prompt tokens P computed itself (P's `local_compute`)."""


@dataclass(frozen=True)
class TurnResult:
    turn: int
    reused: Send
    recomputed: Send | None
    """The same messages with nothing to reuse (None on turn 1, which has nothing anyway)."""


def reuse_counts(metrics_text: str) -> dict[str, float]:
    """The router's reuse outcomes from its Prometheus text."""
    return totals(metrics_text, "boomerang_router_reuse_total", "outcome")


def reuse_outcome(before: dict[str, float], after: dict[str, float]) -> str:
    """Which outcome counter moved during one turn ('?' if none or several did)."""
    moved = [k for k, v in after.items() if v > before.get(k, 0.0)]
    return moved[0] if len(moved) == 1 else "?"


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        return str(resp.read().decode())


def chat_turn(
    client: Any, model: str, messages: list[dict[str, str]]
) -> tuple[str, float, float, int]:
    """One streamed turn: (reply, TTFT, total seconds, prompt tokens)."""
    start = time.perf_counter()
    ttft = None
    parts: list[str] = []
    prompt_tokens = 0
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                ttft = ttft if ttft is not None else time.perf_counter() - start
                parts.append(choice.delta.content)
    total = time.perf_counter() - start
    return "".join(parts), ttft if ttft is not None else total, total, prompt_tokens


def prefill_sources(prefill: Sequence[str]) -> dict[str, float]:
    """Prompt tokens by source, summed over the prefill replicas."""
    found: dict[str, float] = {}
    for url in prefill:
        for source, value in tokens_by_source(_metrics(url)).items():
            found[source] = found.get(source, 0.0) + value
    return found


def measured_send(
    client: Any, model: str, messages: list[dict[str, str]], router: str, prefill: Sequence[str]
) -> tuple[str, Send]:
    """A turn with the router's decision and P's token sources read around it."""
    reuse_before, p_before = reuse_counts(_metrics(router)), prefill_sources(prefill)
    reply, ttft, total, prompt_tokens = chat_turn(client, model, messages)
    reuse_after, p_after = reuse_counts(_metrics(router)), prefill_sources(prefill)

    def moved(source: str) -> int:
        return round(p_after.get(source, 0.0) - p_before.get(source, 0.0))

    outcome = reuse_outcome(reuse_before, reuse_after)
    pulled, computed = moved("external_kv_transfer"), moved("local_compute")
    return reply, Send(ttft, total, prompt_tokens, outcome, pulled, computed)


def run_conversation(
    endpoint: str,
    model: str,
    prefill_urls: Sequence[str],
    turns: int = len(QUESTIONS),
    log: Callable[[str], None] = print,
) -> list[TurnResult]:
    from openai import OpenAI

    client = OpenAI(base_url=endpoint, api_key="local")
    router = endpoint.removesuffix("/v1")
    log("Warming up: one two-turn conversation of the same size, not shown")
    warm = [{"role": "system", "content": WARMUP}, {"role": "user", "content": "Hello."}]
    reply, _ = measured_send(client, model, warm, router, prefill_urls)
    warm += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Again."}]
    measured_send(client, model, warm, router, prefill_urls)

    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    results = []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        reply, reused = measured_send(client, model, messages, router, prefill_urls)
        recomputed = None
        if i > 0:  # the same messages again: the handle is spent, so P computes everything
            _, recomputed = measured_send(client, model, messages, router, prefill_urls)
        log(f"Turn {i + 1} done")
        messages.append({"role": "assistant", "content": reply})
        results.append(TurnResult(i + 1, reused, recomputed))
    return results


def format_table(results: list[TurnResult]) -> str:
    head = (
        "turn  prompt  reuse    TTFT with reuse  pulled/computed  "
        "TTFT recomputed  computed  speed-up"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        a, b = r.reused, r.recomputed
        cells = [
            f"{r.turn:>4}",
            f"{a.prompt_tokens:>6}",
            f"{a.reuse:<7}",
            f"{a.ttft_s * 1000:>12.0f} ms",
            f"{f'{a.pulled}/{a.computed}':>15}",
        ]
        if b is None:
            cells += [f"{'-':>15}", f"{'-':>8}", f"{'-':>8}"]
        else:
            cells += [
                f"{b.ttft_s * 1000:>12.0f} ms",
                f"{b.computed:>8}",
                f"{b.ttft_s / a.ttft_s:>7.1f}x",
            ]
        lines.append("  ".join(cells))
    lines.append(summary(results))
    return "\n".join(lines)


def summary(results: list[TurnResult]) -> str:
    """One line: what reuse bought on the turns that had something to reuse."""
    later = [r for r in results if r.recomputed is not None]
    if not later:
        return "Only one turn: nothing to reuse yet."
    hits = sum(r.reused.reuse == "hit" for r in later)
    on = statistics.median(r.reused.ttft_s for r in later)
    off = statistics.median(r.recomputed.ttft_s for r in later if r.recomputed)
    pulled = sum(r.reused.pulled for r in later)
    prompt = sum(r.reused.prompt_tokens for r in later)
    return (
        f"Turns 2-{results[-1].turn}: {hits} of {len(later)} reused D's KV; median TTFT "
        f"{on * 1000:.0f} ms with reuse against {off * 1000:.0f} ms recomputed "
        f"({off / on:.1f}x); P pulled {pulled} of {prompt} prompt tokens from D instead of "
        f"computing them. Warm-up excluded (NIXL's one-time connection set-up)."
    )
