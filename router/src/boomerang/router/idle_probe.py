"""The idle decoder's time per output token, asked of the decoder itself.

Why it exists: the SLO-aware path choice derives its TPOT bound from what an idle decoder
takes per token (`costmodel.tpot_slo`), and the stall budget from the slack above it. The
streams the router measures cannot tell it that number on a busy cluster: a router started
while traffic runs sees only loaded streams. On the agentic benchmark a fresh router's
fastest stream read 13-16 ms against 6.1 ms idle, so its derived bound was twice too loose
and TPOT ran past the bound it was meant to keep.

So the router asks. When a decoder it would use has nothing in flight from this router, and
was not probed since it joined (or came back after it was lost), the router times two
answers there to fresh short prompts of one length, of 1 token and of `1 + PROBE_TOKENS`
tokens; both prefill alike (the second's prompt is not the first's, which the decoder's
prefix cache would hold), so the difference over `PROBE_TOKENS` is the decoder's time per token (the
benchmark's own method, `boomerang.local.calibrate`). The cost model keeps the fastest probe
(`CostModel.observe_idle_tpot`): another router's traffic can slow one probe, not the quiet
one before it. A probe costs an idle decoder about
`PROBE_TOKENS` steps, once per engine start: never periodically, which would wake a decoder
that sleeps while it only retains blocks (`boomerang.connector.idle_loop`), and never beside
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
from boomerang.router.endpoints import Endpoint, Pool, compatible
from boomerang.router.upstream import EngineClient, UpstreamError, post_json, timeout

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
    measured (an engine error, a timeout, or a result no idle decoder gives)."""
    rng = random.Random(time.time_ns())
    limit = timeout(config.timeouts.prefill_s, config.timeouts.connect_s)
    url = ep.url + "/v1/completions"

    async def timed(max_tokens: int) -> float:
        prompt = " ".join(str(rng.randrange(1000, 10000)) for _ in range(PROMPT_WORDS))
        start = time.perf_counter()
        await post_json(engines, url, _body(config.model, prompt, max_tokens), limit)
        return time.perf_counter() - start

    try:
        short = await timed(1)
        long = await timed(1 + PROBE_TOKENS)
    except UpstreamError as exc:
        log.debug("Idle probe failed", extra={"engine": ep.url, "error": str(exc)})
        return None
    tpot = (long - short) / PROBE_TOKENS
    return tpot if 0 < tpot < MAX_PLAUSIBLE_S else None


async def run_idle_probes(
    engines: EngineClient,
    pools: list[Pool],
    config: RouterConfig,
    observe: Callable[[float], None],
) -> None:
    """Probe idle decoders (`probe_plan`) forever (until cancelled), one at a time, looking
    every `health.probe_interval_s`; each measure goes to `observe`."""
    probed: dict[str, float] = {}
    prefill, decode = pools
    while True:
        for ep in probe_plan(decode.endpoints.values(), prefill.endpoints.values(), probed):
            probed[ep.url] = ep.lost_at
            try:
                tpot = await probe_tpot(engines, ep, config)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Idle probe failed", extra={"engine": ep.url})
                continue
            if tpot is not None:
                observe(tpot)
                ms = round(tpot * 1e3, 3)
                log.info("Probed idle decoder", extra={"engine": ep.url, "tpot_ms": ms})
        await asyncio.sleep(config.health.probe_interval_s)
