"""How much of D's memory any retention policy can save on the agent workload, replayed offline.

Why it exists: the adaptive benchmark measures one policy on the real engines (10 minutes a
run); whether a target such as "half the block-seconds at a hit rate at most 2 points lower"
is reachable at all is a property of the traffic. This replays the gaps one measured run saw
(`agents-<mode>.json`: when each turn's answer ended, when the next turn came, how many blocks
D held for it) under several policies, with no engine:

- `static`: D keeps every handle for its TTL; the router offers it until its handle TTL.
- `learned q`: the adaptive router's rule (`boomerang.router.retention.policy`: the q-quantile
  of the gaps learned so far, each learned when its return happens, within [floor, handle TTL]).
- `known distribution`: the plan's own think-time distribution (log-normal) and share of turns
  that are followed by another, given to the policy in advance; each handle is kept while the
  chance per second that its conversation returns, per block held, is above a price (scanned).
  A policy that also knew the workload's parameters exactly, without seeing any individual
  future; the best of these meeting the hit-rate bound is a reference no learned rule beats by
  much.

Block-seconds here count only retained handles (blocks of the prompt and answer, at D's block
size, from the answer's end to the next turn or the release): the running requests D also
holds are the same under every policy, and left out. So compare the ratios between policies,
and against the measured ratio, not the absolute numbers with D's own metric.

    make bench-retention ARGS=e2e/bench/results/agents-static.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

from boomerang.router.retention.policy import GapLearner, RetentionBounds, retention_s

BLOCK_SIZE = 128
"""D's block size on the CPU engine (what `kv_blocks` counts in)."""


@dataclass(frozen=True)
class Holding:
    """One handle: filed when its turn's answer ended, for `blocks`, and the gap until the
    conversation's next turn (None: it never came)."""

    filed_s: float
    blocks: int
    gap_s: float | None


@dataclass(frozen=True)
class Outcome:
    block_s: float
    hits: int
    returns: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.returns if self.returns else 0.0


Policy = Callable[[GapLearner, float, int], float]
"""(learner as of now, now, blocks) -> seconds the handle is kept."""


def holdings(
    records: Sequence[dict[str, Any]], block_size: int = BLOCK_SIZE, last_output: int = 20
) -> list[Holding]:
    """The handles of a measured run: each successful turn's, with the gap to the next turn.
    D holds a turn's prompt and answer: the next turn's prompt minus its new tokens (the last
    turn's answer length is not recorded: `last_output`)."""
    by_conv: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        if rec.get("done_s") is not None:
            by_conv.setdefault(rec["conversation"], []).append(rec)
    out = []
    for turns in by_conv.values():
        turns.sort(key=lambda r: r["turn"])
        for turn, nxt in zip(turns, [*turns[1:], None], strict=True):
            if nxt is None:
                held = turn["prompt_tokens"] + last_output
            else:
                held = nxt["prompt_tokens"] - nxt["new_tokens"]
            blocks = max(1, math.ceil(held / block_size))
            gap = None if nxt is None else max(0.0, nxt["sent_s"] - turn["done_s"])
            out.append(Holding(turn["done_s"], blocks, gap))
    return out


def replay(items: Sequence[Holding], policy: Policy, *, offered_s: float | None = None) -> Outcome:
    """Every handle kept as `policy` says when it is filed; a gap learned when its turn comes
    back. `offered_s`: the router offers a handle only this long although D keeps it for the
    policy's time (static: handle TTL below D's TTL)."""
    learner = GapLearner()
    events: list[tuple[float, int, float]] = []  # (return time, order, gap): learned then
    order = 0
    block_s, hits, returns = 0.0, 0, 0
    for h in sorted(items, key=lambda x: x.filed_s):
        while events and events[0][0] <= h.filed_s:
            at, _, gap = heapq.heappop(events)
            learner.observe(None, gap, at)
        keep = policy(learner, h.filed_s, h.blocks)
        if h.gap_s is None:
            block_s += h.blocks * keep
            continue
        returns += 1
        offered = keep if offered_s is None else min(keep, offered_s)
        if h.gap_s <= offered:
            hits += 1
            block_s += h.blocks * h.gap_s
        else:
            block_s += h.blocks * keep
        order += 1
        heapq.heappush(events, (h.filed_s + h.gap_s, order, h.gap_s))
    return Outcome(block_s, hits, returns)


def static(decoder_ttl_s: float) -> Policy:
    return lambda _learner, _now, _blocks: decoder_ttl_s


def learned(q: float, floor_s: float, ceiling_s: float) -> Policy:
    bounds = RetentionBounds(quantile=q, min_s=floor_s, ceiling_s=ceiling_s)
    return lambda learner, now, _blocks: retention_s(learner.quantile(None, q, now), bounds)


def known_distribution(
    median_s: float, sigma: float, p_return: float, price: float, ceiling_s: float
) -> Policy:
    """Keep while the return hazard (log-normal gaps, `p_return` of handles ever used) is above
    `price` per block, past the hazard's rise; never beyond `ceiling_s`."""
    normal, mu = NormalDist(), math.log(median_s)

    def hazard(t: float) -> float:
        z = (math.log(t) - mu) / sigma
        density = math.exp(-z * z / 2) / (t * sigma * math.sqrt(2 * math.pi))
        return p_return * density / (1 - p_return * normal.cdf(z))

    peak = median_s * math.exp(-sigma * sigma)  # the density's mode: the hazard rises past it

    def policy(_learner: GapLearner, _now: float, blocks: int) -> float:
        t = max(peak, 0.01)
        while t < ceiling_s:
            if hazard(t) < price * blocks:
                return t
            t *= 1.02
        return ceiling_s

    return policy


def frontier(result: dict[str, Any]) -> list[tuple[str, Outcome]]:
    """The policies' outcomes on one measured run's gaps (see the module docstring)."""
    scale, workload = result["time_scale"], result["workload"]
    items = holdings(result["records"], last_output=round(sum(workload["output_tokens"]) / 2))
    d_ttl, handle_ttl = result["decoder_ttl_s"], result["handle_ttl_s"]
    floor = max(1.0, round(10.0 * scale, 2))
    rows = [("static (D's TTL)", replay(items, static(d_ttl), offered_s=handle_ttl))]
    for q in (0.8, 0.9, 0.95, 0.98, 0.99):
        rows.append((f"learned q {q:.2f}", replay(items, learned(q, floor, handle_ttl))))
    followed = sum(h.gap_s is not None for h in items) / max(len(items), 1)
    median = workload["think_median_s"] * scale
    for price in (2e-4, 4e-4, 6e-4, 8e-4, 1e-3):
        policy = known_distribution(median, workload["think_sigma"], followed, price, handle_ttl)
        rows.append((f"known distribution, price {price:g}", replay(items, policy)))
    return rows


def format_table(rows: Sequence[tuple[str, Outcome]]) -> str:
    base = rows[0][1]
    lines = ["| policy | block-s | x static | hit rate | vs static |", "|---|---|---|---|---|"]
    for name, o in rows:
        ratio = o.block_s / base.block_s if base.block_s else float("nan")
        delta = (o.hit_rate - base.hit_rate) * 100
        lines.append(
            f"| {name} | {o.block_s:.0f} | {ratio:.2f} | {o.hit_rate:.1%} | {delta:+.1f} pts |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("result", type=Path, help="an agents-<mode>.json of bench.agents.run")
    args = ap.parse_args()
    result = json.loads(args.result.read_text())
    print(f"gaps of {args.result.name} (plan {result['plan']}), replayed:")
    print(format_table(frontier(result)))


if __name__ == "__main__":
    main()
