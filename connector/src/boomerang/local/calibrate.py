"""Timeouts from what this machine measures, not from what another machine did.

vLLM's CPU prefill speed differs tens of times between machines of one kind (AVX-512 with BF16
against AVX2 only), so any fixed timeout is either far too long on a fast host or cuts off
correct work on a slow one: a 4k-token turn once outlived the router's 120 s prefill timeout
on a 2-core AMD EPYC without AVX-512, and the client got a 504 while P was still computing.
The local runtime and the benchmark therefore time two prefills of known length on the real
prefill engine, fit `seconds = a * tokens + b * tokens**2` (the linear layers and the
attention), and derive every prefill-bound timeout from that fit at the longest prompt they
will send, with a safety factor and a floor.

`fit` and `timeout_for` are pure; `measure` does the I/O.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from boomerang.local import engine_client

PROBE_TOKENS = (256, 1024)
SAFETY = 6.0
"""Headroom over the fitted time. A timeout only bounds how long a failure takes to notice,
so it errs long: on a 2-core machine a prefill ran 5x slower while the decode engine's
worker spun on retained blocks than when it had been measured on an idle pair."""
FLOOR_S = 120.0
"""Never below the router's own default."""
DEFAULT_LONGEST = 8192
"""The prompt length to size for when the manifest sets no maxModelLen."""


@dataclass(frozen=True)
class PrefillCost:
    """Fitted prefill time of one engine: `linear_s * n + quadratic_s * n * n` seconds."""

    linear_s: float
    quadratic_s: float

    def seconds(self, tokens: int) -> float:
        return self.linear_s * tokens + self.quadratic_s * tokens * tokens

    def rate(self, tokens: int) -> float:
        """Tokens per second at this prompt length."""
        return tokens / self.seconds(tokens)


def fit(samples: list[tuple[int, float]]) -> PrefillCost:
    """The conservative linear + quadratic fit through the shortest and longest samples."""
    (n1, t1), (n2, t2) = min(samples), max(samples)
    per1, per2 = t1 / n1, t2 / n2
    if n1 == n2 or per2 <= per1:
        # No growth of the per-token cost seen (or noise hid it): a line through the slower.
        return PrefillCost(max(per1, per2), 0.0)
    quadratic = (per2 - per1) / (n2 - n1)
    # Clamping the linear term at 0 keeps the curve at or above both samples beyond them.
    return PrefillCost(max(per1 - quadratic * n1, 0.0), quadratic)


def timeout_for(
    cost: PrefillCost, tokens: int, safety: float = SAFETY, floor: float = FLOOR_S
) -> float:
    """Seconds to allow for a prefill of `tokens` on this engine."""
    return max(floor, safety * cost.seconds(tokens))


def router_timeouts(cost: PrefillCost, max_tokens: int) -> dict[str, float]:
    """The router's prefill-bound timeouts for prompts up to `max_tokens` (its config keys)."""
    prefill = timeout_for(cost, max_tokens)
    return {"prefill_s": prefill, "decode_first_byte_s": prefill, "decode_total_s": prefill + 900}


def measure(p_url: str, model: str, lengths: tuple[int, ...] = PROBE_TOKENS) -> PrefillCost:
    """Time one fresh prefill of each length on P (random ids: no prefix cache can help)."""
    rng = random.Random(time.time_ns())
    samples = []
    for n in (16, *lengths):  # the first request after start-up pays one-time costs: not timed
        body: dict[str, Any] = {**engine_client.completion_body(model, [], 1), "stream": False}
        body["prompt"] = [rng.randrange(16, 8000) for _ in range(n)]
        start = time.perf_counter()
        engine_client.post(f"{p_url}/v1/completions", body, timeout=3600.0)
        if n in lengths:
            samples.append((n, time.perf_counter() - start))
    return fit(samples)


TPOT_PROBE_TOKENS = 64


def measure_tpot(d_url: str, model: str, tokens: int = TPOT_PROBE_TOKENS) -> float:
    """One idle decoder's time per output token: a short prompt answered with 1 and with
    `1 + tokens` tokens (fresh random prompts of one length, so both prefill alike), the
    difference over `tokens`; the fastest of two tries. Without logprobs, which vLLM's
    multi-turn client does not ask for: each costs the engine time per token, and with them
    this read 1.3-1.7x the decoder's TPOT. Not streamed (a difference of two whole answers
    is steadier than a stream's arrival times on a loaded host), so it leaves out the few
    per cent a stream's framing adds. The benchmark's TPOT SLO is a multiple of it
    (`production_slo.py`)."""
    rng = random.Random(time.time_ns())

    def timed(max_tokens: int) -> float:
        body = {
            "model": model,
            "prompt": [rng.randrange(16, 8000) for _ in range(32)],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": False,
        }
        start = time.perf_counter()
        engine_client.post(f"{d_url}/v1/completions", body, timeout=600.0)
        return time.perf_counter() - start

    timed(1)  # the first request after start-up pays one-time costs: not timed
    return min((timed(1 + tokens) - timed(1)) / tokens for _ in range(2))
