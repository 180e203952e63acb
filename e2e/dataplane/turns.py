"""What the data-plane tests share: turns through the router or the engines, the reference
turn of one engine computing the same prompt alone, and the counters the tests read.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from kube import wait_until

from boomerang.local import pdclient
from boomerang.local.engine_client import totals

MAX_TOKENS = 8
LOGPROB_TOL = 1e-5
"""Tokens must be identical. Logprobs: D's decode steps run over KV that P computed in one
batch, the reference over KV it computed itself; measured differences are ~5e-7 (float32
rounding of different batch shapes), so they are compared to 1e-5."""


def same(result, expected) -> bool:
    """(tokens or text, logprobs) pairs: identical tokens, logprobs within LOGPROB_TOL."""
    (out, lps), (ref_out, ref_lps) = result, expected
    return out == ref_out and lps == pytest.approx(ref_lps, abs=LOGPROB_TOL)


def reuse(router: str) -> dict[str, float]:
    """The router's reuse outcomes so far, by outcome."""
    return totals(pdclient.scrape(router), "boomerang_router_reuse_total", "outcome")


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def counted(router: str, before: dict[str, float], turns: int = 1) -> dict[str, float]:
    """The reuse outcomes of the `turns` turns served since `before`, once the router counted
    them: it counts a turn after its answer went out (`flow._finish`), so a scrape made as the
    answer arrives may not see it yet (a CI run read `{}` so)."""

    def done() -> dict[str, float] | None:
        after = reuse(router)
        return after if sum(after.values()) - sum(before.values()) >= turns else None

    return moved(before, wait_until(f"{router} counted {turns} turn(s)", done, 10, 0.05))


def words(rng: random.Random, n: int) -> list[int]:
    """n token ids from the model's ordinary vocabulary (ids above the special tokens)."""
    return [rng.randrange(16, 8000) for _ in range(n)]


def router_completion(router: str, model: str, prompt: list[int], conv: str, *, stream: bool):
    body: dict[str, Any] = {
        **pdclient.completion_body(model, prompt, MAX_TOKENS),
        "conversation_id": conv,
        "stream": stream,
    }
    if not stream:
        resp = pdclient.post(f"{router}/v1/completions", body)
        choice = resp["choices"][0]
        return choice["token_ids"], choice["logprobs"]["token_logprobs"], resp
    tokens: list[int] = []
    logprobs: list[float] = []
    last: dict[str, Any] = {}
    for _t, chunk in pdclient.stream_events(f"{router}/v1/completions", body):
        last = chunk
        for choice in chunk.get("choices", []):
            tokens += choice.get("token_ids") or []
            logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
    return tokens, logprobs, last


def reference(plane, prompt: list[int]) -> tuple[list[int], list[float]]:
    turn = pdclient.single_turn(plane.p_url, plane.model, prompt, MAX_TOKENS)
    return turn.tokens, turn.logprobs


def chat(router: str, model: str, messages: list[dict[str, str]], *, stream: bool, conv: str = ""):
    from openai import OpenAI

    client = OpenAI(base_url=f"{router}/v1", api_key="test")
    extra = {"conversation_id": conv} if conv else {}
    kwargs: dict[str, Any] = dict(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=True
    )
    if not stream:
        resp = client.chat.completions.create(**kwargs, extra_body=extra)
        choice = resp.choices[0]
        return choice.message.content or "", [c.logprob for c in choice.logprobs.content]
    text, lps = "", []
    for chunk in client.chat.completions.create(**kwargs, stream=True, extra_body=extra):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            lps += [c.logprob for c in (choice.logprobs.content or [])] if choice.logprobs else []
    return text, lps


def chat_body(model: str, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    """A greedy chat request with logprobs, as every chat test sends it."""
    return {
        "model": model,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "logprobs": True,
        **extra,
    }


def chat_reference(plane, messages: list[dict[str, str]], **extra: Any) -> tuple[str, list[float]]:
    """The same chat on P alone, without transfer params (P has no prefix cache)."""
    body = chat_body(plane.model, messages, **extra)
    choice = pdclient.post(f"{plane.p_url}/v1/chat/completions", body)["choices"][0]
    return choice["message"]["content"], [c["logprob"] for c in choice["logprobs"]["content"]]
