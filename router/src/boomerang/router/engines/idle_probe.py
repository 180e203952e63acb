"""The idle decoder's time per output token, asked of the decoder itself.

Why it exists: the SLO-aware path choice derives its TPOT bound from what an idle decoder
takes per token (`costmodel.tpot_slo`), and the stall budget from the slack above it. The
streams the router measures cannot tell it that number on a busy cluster: a router started
while traffic runs sees only loaded streams. On the agentic benchmark a fresh router's
fastest stream read 13-16 ms against 6.1 ms idle, so its derived bound was twice too loose
and TPOT ran past the bound it was meant to keep.

So the router asks. When a decoder it would use has nothing in flight from this router, and
was not probed since it joined (or came back after it was lost), the router asks two answers
there to fresh short prompts of one length, of 1 token and of `1 + PROBE_TOKENS` tokens (the
second's prompt is not the first's, which the decoder's prefix cache would hold), and reads
the decoder's own measure of them: vLLM's per-request time per output token
(`TPOT_HISTOGRAM`, first token to last as its engine core stamped them), read from
`/metrics` before and after. Only a decoder that finished exactly those two requests in
between was idle; one that finished others was not, and is probed again at the next look
(`PROBE_TRIES` in all). An engine without that histogram is timed from here instead: the
difference of the two answers over `PROBE_TOKENS` (the benchmark's method,
`boomerang.local.calibrate`).

Why the engine's clock and not the router's: the router's own event loop is busiest as it
starts (the engines' KV events replayed into its index, the first health reads), just when
it probes, and a stalled loop that delays one answer's arrival moves the difference at will.
On the pressure benchmark a probe timed from a starting router read 4.2 ms a token where the
benchmark timed the same idle decoder at 6.9 (the same code, run from a process with nothing
else to do, read 6.2-6.8 against the benchmark's 6.5), and the TPOT bound set from it was
too tight for the continues the goodput's bound allowed.

The cost model keeps the fastest probe (`CostModel.observe_idle_tpot`): another router's
traffic can slow one probe, not the quiet one before it. A probe costs an idle decoder about
`PROBE_TOKENS` steps, once per engine start: never periodically, which would wake a decoder
that sleeps while it only retains blocks (`boomerang.connector.plugin.idle_loop`), and never beside
this router's own streams. `health.idle_probe` turns it off.

`probe_plan` is the pure choice of which decoders to probe; `probe_tpot` does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from boomerang.router.config import RouterConfig
from boomerang.router.engines.endpoints import Endpoint, Pool, compatible
from boomerang.router.engines.health import histogram_totals
from boomerang.router.engines.upstream import (
    EngineClient,
    UpstreamError,
    get_bytes,
    post_json,
    timeout,
)

log = logging.getLogger("boomerang.router")

PROBE_TOKENS: Final = 32
"""Output tokens the difference is taken over: enough steps that a millisecond of noise in
either answer moves the result by a few per cent, few enough to cost an idle decoder well
under a second."""
PROMPT_WORDS: Final = 12
"""Random numbers in the probe's prompt: a fresh prompt each time (no prefix cache makes one
answer cheaper than the other), short enough that its prefill is a small part of either."""
MAX_PLAUSIBLE_S: Final = 1.0
"""A per-token time above this is not an idle decoder (a stalled one): not kept."""
PROBE_TRIES: Final = 3
"""Probes of one decoder per engine start that may find it busy (other requests finished
beside the probe's) before the router stops asking: a decoder other routers keep busy never
gives an idle measure, and the streams' stand in (`CostModel.idle_tpot`)."""
TPOT_HISTOGRAM: Final = "vllm:request_time_per_output_token_seconds"
"""vLLM's histogram of each finished request's mean time per output token (0 for a
one-token answer), measured between its engine core's steps."""


def probe_plan(
    decoders: Iterable[Endpoint], prefills: Iterable[Endpoint], probed: dict[str, float]
) -> list[Endpoint]:
    """The decoders to probe now: those the router would hand a turn to (ready, identified,
    compatible with a ready P), with nothing of this router's in flight or streaming there,
    and not probed since they were last lost (`probed`: URL -> the `lost_at` it was probed
    at). An engine that went away and came back may be another model or card: probed again."""
    ready_p = [p for p in prefills if p.ready]
    return [
        ep
        for ep in decoders
        if ep.ready
        and ep.identified
        and ep.inflight == 0
        and not ep.live
        and probed.get(ep.url) != ep.lost_at
        and any(compatible(p, ep) for p in ready_p)
    ]


def _body(model: str | None, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    if model:
        body["model"] = model
    return body


async def probe_tpot(engines: EngineClient, ep: Endpoint, config: RouterConfig) -> float | None:
    """One decoder's idle time per output token (seconds), or None when it could not be
    measured (an engine error, a timeout, other requests finished beside the probe's, or a
    result no idle decoder gives)."""
    rng = random.Random(time.time_ns())
    limit = timeout(config.timeouts.prefill_s, config.timeouts.connect_s)
    url = ep.url + "/v1/completions"

    async def timed(max_tokens: int) -> float:
        prompt = " ".join(str(rng.randrange(1000, 10000)) for _ in range(PROMPT_WORDS))
        start = time.perf_counter()
        await post_json(engines, url, _body(config.model, prompt, max_tokens), limit)
        return time.perf_counter() - start

    async def engine_totals() -> tuple[float, float] | None:
        page = await get_bytes(engines, ep.url + "/metrics", limit)
        return histogram_totals(page, TPOT_HISTOGRAM)

    try:
        before = await engine_totals()
        short = await timed(1)
        long = await timed(1 + PROBE_TOKENS)
        after = await engine_totals()
    except UpstreamError as exc:
        log.debug("Idle probe failed", extra={"engine": ep.url, "error": str(exc)})
        return None
    tpot = probed_tpot(before, after, short, long)
    return tpot if tpot is not None and 0 < tpot < MAX_PLAUSIBLE_S else None


def probed_tpot(
    before: tuple[float, float] | None,
    after: tuple[float, float] | None,
    short_s: float,
    long_s: float,
) -> float | None:
    """The probe's time per token (pure): the engine's own measure of the long answer when it
    publishes `TPOT_HISTOGRAM` ((sum, count) `before` and `after` the two answers) and
    finished exactly those two between; None when it finished others too (it was not idle);
    the difference of the two answers' times (`short_s`, `long_s`) from here when it
    publishes none."""
    if before is None or after is None:
        return (long_s - short_s) / PROBE_TOKENS
    if after[1] - before[1] != 2:
        return None
    return after[0] - before[0]  # the one-token answer adds 0


async def run_idle_probes(
    engines: EngineClient,
    pools: list[Pool],
    config: RouterConfig,
    observe: Callable[[float], None],
) -> None:
    """Probe idle decoders (`probe_plan`) forever (until cancelled), one at a time, looking
    every `health.probe_interval_s`; each measure goes to `observe`. A decoder is done for
    its engine start once measured, or after `PROBE_TRIES` probes that measured nothing."""
    probed: dict[str, float] = {}
    tries: dict[str, tuple[float, int]] = {}  # URL -> (lost_at, probes that measured nothing)
    prefill, decode = pools
    while True:
        for ep in probe_plan(decode.endpoints.values(), prefill.endpoints.values(), probed):
            try:
                tpot = await probe_tpot(engines, ep, config)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Idle probe failed", extra={"engine": ep.url})
                tpot = None
            if tpot is not None:
                probed[ep.url] = ep.lost_at
                observe(tpot)
                ms = round(tpot * 1e3, 3)
                log.info("Probed idle decoder", extra={"engine": ep.url, "tpot_ms": ms})
                continue
            lost_at, failed = tries.get(ep.url, (ep.lost_at, 0))
            failed = failed + 1 if lost_at == ep.lost_at else 1
            tries[ep.url] = (ep.lost_at, failed)
            if failed >= PROBE_TRIES:
                probed[ep.url] = ep.lost_at
        await asyncio.sleep(config.health.probe_interval_s)
