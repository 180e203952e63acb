"""Driving a P/D pair directly, without the router: the reference the router is measured by.

The benchmark compares TTFT through the router with TTFT of this direct flow (the router must
keep at least 90% of the gain), and the data-plane tests use it as a second, independent
implementation of the protocol. Prompts are token ids (`/v1/completions` with a list of ids),
so turn N+1's prompt is exactly turn N's prompt + output + new tokens: no re-tokenisation.

The flow (vllm-pd-protocol.md): P computes the prompt (pulling D's retained blocks when given
a handle) and answers with one token and its own params; D pulls P's blocks, generates, and
answers with the handle for the next turn.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

# The plain engine calls are the local runtime's own; the tests and benchmarks reach them here too.
from boomerang.local.engine_client import completion_body as completion_body
from boomerang.local.engine_client import post as post
from boomerang.local.engine_client import scrape as scrape
from boomerang.local.engine_client import stream_events as stream_events
from boomerang.local.engine_client import tokens_by_source as tokens_by_source

FRESH = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass
class Turn:
    """One generated turn: D's tokens and logprobs, timings, and the handle for the next turn."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    ttft_s: float
    prefill_s: float
    handle: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict)


def get_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """A JSON body, whatever the status (a 503 from /ready carries one too); {} when none."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
    except (urllib.error.URLError, OSError):
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def next_handle(d_params: dict[str, Any] | None) -> dict[str, Any] | None:
    """D's returned params, as P must receive them on the next turn."""
    if not d_params or not d_params.get("remote_block_ids"):
        return None
    return {**d_params, "do_remote_decode": True, "do_remote_prefill": False}


def pd_turn(
    p_url: str,
    d_url: str,
    model: str,
    prompt: list[int],
    handle: dict[str, Any] | None,
    max_tokens: int = 8,
    timeout: float = 300.0,
) -> Turn:
    """One turn through P then D (D streamed, so TTFT is the first token's arrival)."""
    start = time.perf_counter()
    p_body = {**completion_body(model, prompt, 1), "stream": False}
    p_body["kv_transfer_params"] = handle or dict(FRESH)
    p_resp = post(f"{p_url}/v1/completions", p_body, timeout)
    prefill_s = time.perf_counter() - start
    d_body = {**completion_body(model, prompt, max_tokens), "stream": True}
    d_body["kv_transfer_params"] = p_resp["kv_transfer_params"]
    return _collect(f"{d_url}/v1/completions", d_body, prompt, (start, prefill_s), timeout)


def single_turn(
    url: str, model: str, prompt: list[int], max_tokens: int = 8, timeout: float = 300.0
) -> Turn:
    """The same prompt on one engine with no transfer at all: the correctness reference."""
    start = time.perf_counter()
    body = {**completion_body(model, prompt, max_tokens), "stream": True}
    return _collect(f"{url}/v1/completions", body, prompt, (start, 0.0), timeout)


def _collect(
    url: str, body: dict[str, Any], prompt: list[int], times: tuple[float, float], timeout: float
) -> Turn:
    start, pre = times
    turn = Turn(prompt=prompt, tokens=[], logprobs=[], ttft_s=0.0, prefill_s=pre)
    for arrived, chunk in stream_events(url, body, timeout):
        for choice in chunk.get("choices", []):
            ids = choice.get("token_ids") or []
            if ids and not turn.tokens:
                turn.ttft_s = arrived - start
            turn.tokens += ids
            turn.logprobs += list((choice.get("logprobs") or {}).get("token_logprobs") or [])
        if chunk.get("kv_transfer_params"):
            turn.handle = next_handle(chunk["kv_transfer_params"])
    return turn


def external_tokens(metrics_text: str) -> float:
    """P's `prompt_tokens_by_source{source="external_kv_transfer"}` total."""
    return tokens_by_source(metrics_text).get("external_kv_transfer", 0.0)
