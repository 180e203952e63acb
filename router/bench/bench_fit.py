"""What the cost model's learning costs the router per turn: `make bench-fit` (a few seconds).

Every routed turn feeds the cost model two observations in both modes (the P leg, and D's first
token), so their CPU is part of every turn's. This feeds a `CostModel` the same stream of
turn-shaped observations (conversations of 8 turns: a miss computes the history, later turns
pull it and compute a short suffix; seeded noise) and prints the time per turn, the solves per
observation and the coefficients learned. Another tree's fit:
`PYTHONPATH=<tree>/router/src make bench-fit` (its router is then imported first).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from boomerang.router.learning import wls
from boomerang.router.learning.costmodel import Coefficients, CostModel

Observation = tuple[int, int, float, int, float]
"""Computed tokens, pulled tokens, P's seconds, D's prompt tokens, D's first-token seconds."""


def observations(turns: int, seed: int = 1) -> list[Observation]:
    """Seeded, turn-shaped observations (about what the router benchmark's turns produce)."""
    rng = random.Random(seed)
    out = []
    for i in range(turns):
        history, suffix = 640 * (i % 8), rng.randint(20, 60)
        pulled = history if i % 8 else 0
        computed = suffix if pulled else history + suffix
        p_s = 3e-4 + 1e-6 * computed + 2e-7 * pulled + 3e-4 * rng.random()
        d_s = 4e-4 + 5e-7 * (computed + pulled) + 3e-4 * rng.random()
        out.append((computed, pulled, p_s, computed + pulled, d_s))
    return out


def run(stream: list[Observation]) -> tuple[float, int, Coefficients]:
    """Seconds per turn, solves made, and the coefficients at the end (read once)."""
    model = CostModel()
    solve, solves = wls.nonnegative_solve, [0]

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        solves[0] += 1
        return solve(*args, **kwargs)

    wls.nonnegative_solve = counted
    try:
        start = time.perf_counter()
        for computed, pulled, p_s, prompt, d_s in stream:
            model.observe_prefill(computed, pulled, p_s)
            model.observe_decode_first(prompt, d_s)
        seconds = (time.perf_counter() - start) / len(stream)
        return seconds, solves[0], model.coefficients()
    finally:
        wls.nonnegative_solve = solve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--turns", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    stream = observations(args.turns)
    runs = [run(stream) for _ in range(args.repeats)]
    per_turn = [r[0] * 1e6 for r in runs]
    _, solves, coefficients = runs[-1]
    print(f"{args.turns} turns (2 observations each), {args.repeats} repeats")
    print("| µs per turn, median (min-max) | solves per observation |")
    print("|---|---|")
    print(
        f"| {statistics.median(per_turn):.1f} ({min(per_turn):.1f}-{max(per_turn):.1f}) "
        f"| {solves / (2 * args.turns):.3f} |"
    )
    print("coefficients learned:")
    for name, value in coefficients.as_metrics().items():
        print(f"  {name} = {value:.6g}")


if __name__ == "__main__":
    main()
