"""How much the simulator's conclusions lean on the constants nobody measured.

Why: the GPU profile has constants fitted to six published numbers (prefill efficiency, the
pull's cost beyond the read) and choices no source fixes (where that pull cost falls, KV
capacity per engine, how bursty arrivals are). A conclusion that flips when one of them moves
within reason is a statement about that constant, not about Boomerang. So two cases of the
sweeps, the one Boomerang wins (P overloaded and forgetting) and one with KV to spare, are run
again with one constant moved at a time, every policy that matters on the same seeded
conversations, and the table says for each whether the default's goodput is ahead of the best
peer's, behind it, or inside the seeds' band (`verdict`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from boomsim.cluster import Topology
from boomsim.policies import Settings
from boomsim.profiles import Profile, h200_qwen3_32b
from boomsim.run import Load, run
from boomsim.sweep import (
    FIGURES,
    HIGHER,
    SESSION_WINDOW_S,
    Sizes,
    banded,
    best_baselines,
    cell,
    per_s,
)
from boomsim.workload import AGENTIC, stream

DEFAULT = "adaptive"
"""Boomerang's default mode, the row each case is read for."""
POLICIES = (
    "affinity",
    "cpu-tier",
    "decode-first-2048",
    "decode-first-8192",
    "dynamo",
    "dynamo-load",
    "static",
    DEFAULT,
)
"""The peers that won some figure in the sweeps, P's CPU tier, and Boomerang's two modes."""
OVERLOAD_SESSIONS = 1000
"""The overload case's sessions (4P8D, within `SESSION_WINDOW_S`): the sessions sweep's row
where the default has the most goodput."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One constant moved from the profile's value (`profile`), or the arrivals (`burst_cv`)."""

    name: str
    profile: Callable[[Profile], Profile] = lambda p: p
    burst_cv: float = 1.0


VARIANTS = (
    Variant("as fitted"),
    Variant("prefill efficiency 0.30", lambda p: dataclasses.replace(p, mfu=0.30)),
    Variant("prefill efficiency 0.60", lambda p: dataclasses.replace(p, mfu=0.60)),
    Variant(
        "a pull's extra cost is P's compute",
        lambda p: dataclasses.replace(p, pull_on_compute=True),
    ),
    Variant("KV 64,000 blocks an engine", lambda p: dataclasses.replace(p, kv_blocks=64_000)),
    Variant("bursty arrivals (gaps' CV 3)", burst_cv=3.0),
)
"""Fitted efficiency is 0.436 (`GPU_FIT`): 0.30 and 0.60 are the range a fit on other
published points could give; 64,000 blocks is where the KV sweep's wins and losses turn."""


def cases(sizes: Sizes) -> dict[str, tuple[Topology, int, float]]:
    """The two cases at `sizes`: name -> (topology, sessions, arrival rate per second)."""
    overload = min(OVERLOAD_SESSIONS, max(sizes.session_counts))
    spare = sizes.sessions_per_decoder * 2
    return {
        f"overload (4P8D, {overload:,} sessions in {SESSION_WINDOW_S:.0f} s)": (
            Topology(4, 8),
            overload,
            overload / SESSION_WINDOW_S,
        ),
        f"KV to spare (1P2D, {spare} sessions)": (
            Topology(1, 2),
            spare,
            sizes.rate_per_decoder * 2,
        ),
    }


def sweep(sizes: Sizes, seed: int) -> list[dict[str, Any]]:
    """Every case, variant and policy once at `seed`; rows keyed by `case`."""
    rows = []
    for case, (topo, sessions, rate) in cases(sizes).items():
        for v in VARIANTS:
            profile = v.profile(h200_qwen3_32b())
            load = Load(rate=rate, seed=seed, burst_cv=v.burst_cv)
            for policy in POLICIES:
                r = run(profile, topo, Settings(policy), stream(AGENTIC, sessions, seed), load)
                s = r.summary
                rows.append(
                    {
                        "case": f"{case}: {v.name}",
                        "policy": policy,
                        **{k: s[k] for k in (*FIGURES, "turns", "paths")},
                    }
                )
    return rows


def over_seeds(sizes: Sizes) -> list[dict[str, Any]]:
    return banded([r for seed in sizes.seeds for r in sweep(sizes, seed)], "case")


def verdict(default: dict[str, Any], peer: dict[str, Any], figure: str, higher: bool) -> str:
    """Where the default stands on `figure` against `peer`: ahead or behind when their bands
    over the seeds do not meet, else inside the band."""
    lo, hi = default["band"][figure]
    plo, phi = peer["band"][figure]
    if (lo > phi) if higher else (hi < plo):
        return "ahead"
    if (hi < plo) if higher else (lo > phi):
        return "behind"
    return "inside the band"


def markdown(rows: list[dict[str, Any]]) -> str:
    """Per case and variant: the default's goodput and follow-up median against the best
    peer's at each, their ratio, and the verdict from the bands."""
    seeds = max((r.get("seeds", 1) for r in rows), default=1)
    lines = [
        "| case: constant moved | goodput: default | best peer | ratio | verdict | "
        "follow-up p50: default | best peer | ratio | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    best = best_baselines(rows, "case")
    for case in dict.fromkeys(r["case"] for r in rows):
        group = {r["policy"]: r for r in rows if r["case"] == case}
        mine = group[DEFAULT]
        cells = [case]
        for figure, fmt in (("goodput", per_s), ("follow_p50", None)):
            peer = group[best[case][figure]]
            ratio = mine[figure] / peer[figure] if peer[figure] else float("nan")
            cells += [
                cell(mine, figure, fmt),
                f"{peer['policy']} {cell(peer, figure, fmt)}",
                f"{ratio:.2f}x",
                verdict(mine, peer, figure, figure in HIGHER),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"\nGoodput in turns per second. Medians over {seeds} seed(s); in brackets, the lowest "
        "and highest seed. Verdict: the default's band clear of the best peer's, or not."
    )
    return "\n".join(lines)
