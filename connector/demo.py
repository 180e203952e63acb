"""`boomerang demo`: a short multi-turn chat through the local stack with the official client.

It shows the product in one screen: each turn's time to first token as the client sees it, and
whether the router reused the conversation's KV from the decoder (read from the router's own
`boomerang_router_reuse_total{outcome}` counter, before and after the turn). Turn 1 is always a
miss (nothing to reuse yet); every later turn should be a hit.
"""

from __future__ import annotations

import re
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

_REUSE = re.compile(r'^boomerang_router_reuse_total\{outcome="(\w+)"\}\s+([0-9.eE+-]+)$', re.M)

QUESTIONS = [
    "Tell me a story about a boomerang that always comes back with more than it took.",
    "Now retell it from the point of view of the tree it hit on the way.",
    "Summarise both versions in three sentences, then suggest a title.",
    "Translate the title into a pirate's dialect and explain the joke.",
]


@dataclass(frozen=True)
class TurnResult:
    turn: int
    prompt_tokens: int
    ttft_s: float
    total_s: float
    reuse: str


def reuse_counts(metrics_text: str) -> dict[str, float]:
    """The router's reuse outcomes from its Prometheus text."""
    return {m.group(1): float(m.group(2)) for m in _REUSE.finditer(metrics_text)}


def reuse_outcome(before: dict[str, float], after: dict[str, float]) -> str:
    """Which outcome counter moved during one turn ('?' if none or several did)."""
    moved = [k for k, v in after.items() if v > before.get(k, 0.0)]
    return moved[0] if len(moved) == 1 else "?"


def _scrape(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        return reuse_counts(resp.read().decode())


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
        max_tokens=32,
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


def run_conversation(endpoint: str, model: str, turns: int = len(QUESTIONS)) -> list[TurnResult]:
    from openai import OpenAI

    client = OpenAI(base_url=endpoint, api_key="local")
    metrics_url = endpoint.removesuffix("/v1") + "/metrics"
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a helpful assistant. " * 40}
    ]
    results = []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        before = _scrape(metrics_url)
        reply, ttft, total, prompt_tokens = chat_turn(client, model, messages)
        outcome = reuse_outcome(before, _scrape(metrics_url))
        messages.append({"role": "assistant", "content": reply})
        results.append(TurnResult(i + 1, prompt_tokens, ttft, total, outcome))
    return results


def format_table(results: list[TurnResult]) -> str:
    lines = [
        "turn  prompt tokens  TTFT ms  total ms  reuse",
        "----  -------------  -------  --------  -----",
    ]
    for r in results:
        lines.append(
            f"{r.turn:>4}  {r.prompt_tokens:>13}  {r.ttft_s * 1000:>7.0f}  "
            f"{r.total_s * 1000:>8.0f}  {r.reuse}"
        )
    return "\n".join(lines)
