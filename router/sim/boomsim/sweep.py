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
from collections.abc import Iterator
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
    """How much each sweep simulates."""

    sessions_per_decoder: int
    rate_per_decoder: float
    session_counts: tuple[int, ...]
    kv_blocks: tuple[int, ...]
    suffixes: tuple[int, ...]
    suffix_conversations: int


FULL = Sizes(
    200, 0.25, (10, 100, 1000, 10_000), (4_000, 16_000, 64_000, 226_000), (64, 512, 2048, 8192), 400
)
QUICK = Sizes(40, 0.25, (10, 100, 1000), (4_000, 64_000), (64, 2048), 60)


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
    keep = (
        "turns",
        "ttft_p50",
        "ttft_p99",
        "follow_p50",
        "follow_p99",
        "tpot_p50",
        "turns_per_s",
        "paths",
    )
    return {**label, "policy": policy, **{k: s[k] for k in keep}, "wall_s": r.wall_s}


def ratios(sizes: Sizes, seed: int = 0) -> list[dict[str, Any]]:
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


def sessions(sizes: Sizes, seed: int = 0) -> list[dict[str, Any]]:
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


def kv(sizes: Sizes, seed: int = 0) -> list[dict[str, Any]]:
    """1P2D, both roles at each KV size, agentic sessions."""
    rows = []
    for blocks in sizes.kv_blocks:
        topo = Topology(1, 2, p_blocks=blocks, d_blocks=blocks)
        for policy in POLICIES:
            load = Load(rate=sizes.rate_per_decoder * 2, seed=seed)
            convs = stream(AGENTIC, sizes.sessions_per_decoder * 2, seed)
            rows.append(_row({"kv_blocks": blocks}, policy, h200_qwen3_32b(), topo, convs, load))
    return rows


def suffix(sizes: Sizes, seed: int = 0) -> list[dict[str, Any]]:
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


FIGURES = ("ttft_p50", "ttft_p99", "follow_p50", "follow_p99", "tpot_p50", "turns_per_s")
"""What each row is judged by; every one is better lower but throughput."""


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
            best[figure] = (ranked[-1] if figure == "turns_per_s" else ranked[0])["policy"]
        out[value] = best
    return out


def markdown(rows: list[dict[str, Any]], key: str) -> str:
    """One table: the swept value, the policy, TTFT, TPOT, throughput, paths; after each
    swept value, the best peer policy for each figure."""
    lines = [
        f"| {key} | policy | TTFT p50 / p99 | follow-up p50 / p99 | TPOT p50 | turns/s | paths |",
        "|---|---|---|---|---|---|---|",
    ]
    best = best_baselines(rows, key)
    values = list(dict.fromkeys(r[key] for r in rows))
    for value in values:
        for r in (r for r in rows if r[key] == value):
            paths = " ".join(f"{k} {v}" for k, v in r["paths"].items())
            lines.append(
                f"| {r[key]} | {r['policy']} | {_t(r['ttft_p50'])} / {_t(r['ttft_p99'])} | "
                f"{_t(r['follow_p50'])} / {_t(r['follow_p99'])} | {_t(r['tpot_p50'])} | "
                f"{r['turns_per_s']:.2f} | {paths} |"
            )
        if (b := best.get(value)) is not None:
            lines.append(
                f"| {value} | *best peer* | {b['ttft_p50']} / {b['ttft_p99']} | "
                f"{b['follow_p50']} / {b['follow_p99']} | {b['tpot_p50']} | {b['turns_per_s']} | |"
            )
    return "\n".join(lines)


def _t(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
