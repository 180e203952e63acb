"""What the simulator answers: the policies swept over P:D ratio, sessions, KV and suffix.

Why these four: the seeds' case rests on ratios a two-core machine cannot show. One P serving
several decoders evicts what D still holds (P:D ratio); many sessions fill every cache
(sessions); D's memory decides how long it can hold a history (KV per role); and the suffix
decides whether continuing on D, pulling, or recomputing wins (suffix length). Every run is the
GPU profile with P's prefix cache on (the production setting), every policy on the same seeded
conversations.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from statistics import median
from typing import Any

from boomsim.cluster import Topology
from boomsim.policies import BIDIRECTIONAL, POLICIES, Settings
from boomsim.profiles import Profile, h200_qwen3_32b
from boomsim.run import Load, run
from boomsim.workload import AGENTIC, Shape, Turns, stream

RATIOS = ((1, 1), (1, 2), (1, 4), (4, 8))
SESSION_WINDOW_S = 30.0
"""Sessions of the session sweep all arrive within this window."""


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each sweep simulates, and over which seeds."""

    sessions_per_decoder: int
    rate_per_decoder: float
    session_counts: tuple[int, ...]
    kv_blocks: tuple[int, ...]
    suffixes: tuple[int, ...]
    suffix_conversations: int
    seeds: tuple[int, ...] = (0,)
    """Each row runs once per seed (other conversations, other arrivals); the tables give the
    median and the band (lowest to highest) over them."""


FULL = Sizes(
    200,
    0.25,
    (10, 100, 1000, 10_000),
    (4_000, 16_000, 64_000, 226_000),
    (64, 512, 2048, 8192),
    400,
    seeds=(0, 1, 2),
)
QUICK = Sizes(40, 0.25, (10, 100, 1000), (4_000, 64_000), (64, 2048), 60)

FIGURES = (
    "first_p50",
    "follow_p50",
    "follow_p99",
    "tpot_p50",
    "tpot_p99",
    "gap_p99",
    "kv_held",
    "goodput",
    "attainment",
    "turns_per_s",
)
"""What each row is judged by, every one over the seeds; lower is better but for the rates."""
HIGHER = frozenset({"goodput", "attainment", "turns_per_s"})


def _row(
    label: dict[str, Any],
    policy: str,
    profile: Profile,
    topo: Topology,
    convs: Iterator[Turns],
    load: Load,
) -> dict[str, Any]:
    r = run(profile, topo, Settings(policy), convs, load)
    s = r.summary
    return {**label, "policy": policy, **{k: s[k] for k in (*FIGURES, "turns", "paths")}}


def banded(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """One row per swept value and policy from the runs of every seed: each figure's median,
    its band (`band[figure]`: lowest, highest), the paths' mean per seed, how many seeds."""
    groups: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r[key], r["policy"]), []).append(r)
    out = []
    for (value, policy), runs in groups.items():
        paths: dict[str, float] = {}
        for r in runs:
            for path, n in r["paths"].items():
                paths[path] = paths.get(path, 0) + n / len(runs)
        out.append(
            {
                key: value,
                "policy": policy,
                **{f: _median(_known(runs, f)) for f in FIGURES},
                "band": {f: _band(_known(runs, f)) for f in FIGURES},
                "turns": median(r["turns"] for r in runs),
                "paths": {k: round(v) for k, v in sorted(paths.items())},
                "seeds": len(runs),
            }
        )
    return out


def over_seeds(
    sweep: Callable[[Sizes, int], list[dict[str, Any]]], sizes: Sizes, key: str
) -> list[dict[str, Any]]:
    """A sweep run once per seed of `sizes`, its rows `banded` by the swept `key`."""
    return banded([r for seed in sizes.seeds for r in sweep(sizes, seed)], key)


def ratios(sizes: Sizes, seed: int) -> list[dict[str, Any]]:
    """Agentic sessions arriving at a rate proportional to the decoders, per P:D ratio."""
    rows = []
    for p, d in RATIOS:
        load = Load(rate=sizes.rate_per_decoder * d, seed=seed)
        for policy in POLICIES:
            convs = stream(AGENTIC, sizes.sessions_per_decoder * d, seed)
            rows.append(
                _row({"ratio": f"{p}P{d}D"}, policy, h200_qwen3_32b(), Topology(p, d), convs, load)
            )
    return rows


def sessions(sizes: Sizes, seed: int) -> list[dict[str, Any]]:
    """4P8D, N agentic sessions arriving within `SESSION_WINDOW_S`."""
    rows = []
    for n in sizes.session_counts:
        for policy in POLICIES:
            load = Load(rate=n / SESSION_WINDOW_S, seed=seed)
            rows.append(
                _row(
                    {"sessions": n},
                    policy,
                    h200_qwen3_32b(),
                    Topology(4, 8),
                    stream(AGENTIC, n, seed),
                    load,
                )
            )
    return rows


def kv(sizes: Sizes, seed: int) -> list[dict[str, Any]]:
    """1P2D, both roles at each KV size, agentic sessions."""
    rows = []
    for blocks in sizes.kv_blocks:
        topo = Topology(1, 2, p_blocks=blocks, d_blocks=blocks)
        for policy in POLICIES:
            load = Load(rate=sizes.rate_per_decoder * 2, seed=seed)
            convs = stream(AGENTIC, sizes.sessions_per_decoder * 2, seed)
            rows.append(_row({"kv_blocks": blocks}, policy, h200_qwen3_32b(), topo, convs, load))
    return rows


def suffix(sizes: Sizes, seed: int) -> list[dict[str, Any]]:
    """1P2D, vLLM's multi-turn shape with user turns of s/2..s tokens, 32 clients."""
    rows = []
    for s in sizes.suffixes:
        shape = Shape(user=(max(1, s // 2), s))
        for policy in POLICIES:
            convs = stream(shape, sizes.suffix_conversations, seed)
            rows.append(
                _row(
                    {"suffix": s},
                    policy,
                    h200_qwen3_32b(),
                    Topology(1, 2),
                    convs,
                    Load(clients=32, max_active=32, seed=seed),
                )
            )
    return rows


def best_baselines(rows: list[dict[str, Any]], key: str) -> dict[Any, dict[str, str]]:
    """Per swept value, the peer policy (not Boomerang's) best at each figure: a frontier no
    single peer reaches, which Boomerang's rows are read against."""
    out: dict[Any, dict[str, str]] = {}
    for value in dict.fromkeys(r[key] for r in rows):
        peers = [r for r in rows if r[key] == value and r["policy"] not in BIDIRECTIONAL]
        if not peers:
            continue
        best: dict[str, str] = {}
        for figure in FIGURES:
            ranked = sorted(peers, key=lambda r: float(r[figure]))
            best[figure] = (ranked[-1] if figure in HIGHER else ranked[0])["policy"]
        out[value] = best
    return out


def _known(runs: list[dict[str, Any]], figure: str) -> list[float]:
    """A figure's values over the seeds, leaving out a seed that has none (nan: no turn)."""
    return [v for r in runs if not math.isnan(v := float(r[figure]))]


def _median(values: list[float]) -> float:
    return median(values) if values else math.nan


def _band(values: list[float]) -> list[float]:
    return [min(values), max(values)] if values else [math.nan, math.nan]


def markdown(rows: list[dict[str, Any]], key: str) -> str:
    """One table: the swept value, the policy, each figure's median over the seeds with its
    band in brackets, the paths; after each swept value, the best peer policy per figure."""
    seeds = max((r.get("seeds", 1) for r in rows), default=1)
    lines = [
        f"| {key} | policy | first turn p50 | follow-up p50 | follow-up p99 | TPOT p50 / p99 | "
        "worst gap p99 | D's KV held | goodput (attainment) | turns/s | paths |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    best = best_baselines(rows, key)
    for value in dict.fromkeys(r[key] for r in rows):
        for r in (r for r in rows if r[key] == value):
            paths = " ".join(f"{k} {v}" for k, v in r["paths"].items())
            lines.append(
                f"| {r[key]} | {r['policy']} | {cell(r, 'first_p50')} | {cell(r, 'follow_p50')} | "
                f"{cell(r, 'follow_p99')} | {_t(r['tpot_p50'])} / {_t(r['tpot_p99'])} | "
                f"{_t(r['gap_p99'])} | {r['kv_held']:.0%} | "
                f"{cell(r, 'goodput', per_s)} ({r['attainment']:.0%}) | "
                f"{r['turns_per_s']:.2f} | {paths} |"
            )
        if (b := best.get(value)) is not None:
            lines.append(
                f"| {value} | *best peer* | {b['first_p50']} | {b['follow_p50']} | "
                f"{b['follow_p99']} | {b['tpot_p50']} / {b['tpot_p99']} | {b['gap_p99']} | "
                f"{b['kv_held']} | {b['goodput']} | "
                f"{b['turns_per_s']} | |"
            )
    if seeds > 1:
        lines.append(f"\nMedians over {seeds} seeds; in brackets, the lowest and highest seed.")
    return "\n".join(lines)


def cell(row: dict[str, Any], figure: str, fmt: Callable[[float], str] | None = None) -> str:
    """A figure's median, and its band over the seeds when there is one."""
    fmt = fmt or _t
    lo, hi = row.get("band", {}).get(figure, (row[figure], row[figure]))
    if lo == hi:
        return fmt(row[figure])
    return f"{fmt(row[figure])} [{fmt(lo)}-{fmt(hi)}]"


def per_s(value: float) -> str:
    return f"{value:.2f}"


def _t(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
