"""Simulated against published: the seeds' 1P1D table on H200s, and the CPU engines' slots.

Why: a simulator is worth its error. The GPU profile's efficiencies were fitted to the
published prefill durations and transfer times (`profiles.h200_qwen3_32b`); what is compared
here is the TTFT of the same runs, which also holds queueing behind the other client, P->D
transfer, D's first step and D's own prefix cache: the parts the fit did not see. The
published TTFT is given at its shortest and longest prefix (the blog's text; the points between
are only drawn in its chart), so those two are compared, and the simulated points between are
shown for the curve's shape.
"""

from __future__ import annotations

from typing import Any

from boomsim.cluster import Topology
from boomsim.policies import Settings
from boomsim.profiles import (
    GPU_STEP_FIXED_S,
    PUBLISHED_PREFILL_OFF_S,
    PUBLISHED_PREFILL_ON_S,
    PUBLISHED_PREFIX,
    PUBLISHED_TURNS,
    PUBLISHED_USER,
    GpuFit,
    Profile,
    h200_qwen3_32b,
    pulled_tokens,
    turn_prompts,
)
from boomsim.run import Load, run
from boomsim.workload import published

PUBLISHED_TTFT_S = {"off": (0.158, 0.778), "on": (0.122, 0.460)}
"""The blog's TTFT at 2k and 24k, bidirectional transfer off and on (P's prefix cache off)."""
SWEEP = (2000, 4000, 8000, 12000, 16000, 20000, 24000)
LEGS = {"off": "plain", "on": "static"}
"""The blog's legs as policies: its proxy pairs the one P and one D round robin; with the
feature on P pulls whatever D offers at or above the threshold (64), which is `static` with
P's cache off."""


def published_run(prefix: int, leg: str, profile: Profile | None = None) -> dict[str, Any]:
    """The published sweep's point at `prefix`, one leg: the run's summary."""
    topo = Topology(1, 1, p_caching=False)
    convs = iter([published(prefix) for _ in range(10)])
    prof = profile if profile is not None else h200_qwen3_32b()
    r = run(prof, topo, Settings(LEGS[leg]), convs, Load(clients=2, max_active=10))
    return r.summary


def published_point(prefix: int, leg: str, profile: Profile | None = None) -> float:
    """Simulated mean TTFT over every turn of the published sweep at `prefix`."""
    return float(published_run(prefix, leg, profile)["ttft_mean"])


def _line(x: tuple[float, float], y: tuple[float, float]) -> tuple[float, float]:
    """Intercept and slope of the line through two points."""
    slope = (y[1] - y[0]) / (x[1] - x[0])
    return y[0] - slope * x[0], slope


def fit_gpu(rounds: int = 6) -> GpuFit:
    """The GPU profile's efficiencies from the published prefill durations (module docs).

    Each step solves the two-point line in closed form (the mean P leg of the published turns
    against their mean FLOPs, or against their mean pulled tokens), then simulates the
    published runs (two clients: their prefills sometimes share P's steps) and moves the
    targets by what the simulation added, until the simulated P legs match."""
    base = h200_qwen3_32b()
    fit = GpuFit(base.mfu, base.request_overhead_s, 0.0, 0.0)
    peak = base.peak_flops

    def flops(n: int, ctx: int) -> float:
        return n * base.linear_flops + base.attn_flops * n * (ctx + n / 2)

    off_x = tuple(
        sum(flops(n, 0) for n in turn_prompts(p)) / PUBLISHED_TURNS for p in PUBLISHED_PREFIX
    )
    target = list(PUBLISHED_PREFILL_OFF_S)
    for _ in range(rounds):
        fixed, per_flop = _line(off_x, (target[0], target[1]))  # type: ignore[arg-type]
        fit = GpuFit(1 / (per_flop * peak), max(0.0, fixed - GPU_STEP_FIXED_S), 0.0, 0.0)
        sims = [
            published_run(p, "off", h200_qwen3_32b(fit=fit))["p_leg_mean"] for p in PUBLISHED_PREFIX
        ]
        target = [
            t + (pub - s) for t, pub, s in zip(target, PUBLISHED_PREFILL_OFF_S, sims, strict=True)
        ]
    # With pulls: the mean P leg is known but for the pull's extra cost (fixed, per token).
    prof = h200_qwen3_32b(fit=fit)
    known, pulled = [], []
    for p in PUBLISHED_PREFIX:
        first = turn_prompts(p)[0]
        legs = [flops(first, 0) / (peak * fit.mfu)]
        legs += [
            prof.transfer_s(t) + flops(PUBLISHED_USER, t) / (peak * fit.mfu)
            for t in pulled_tokens(p)
        ]
        known.append(prof.request_overhead_s + prof.step_fixed_s + sum(legs) / PUBLISHED_TURNS)
        pulled.append(sum(pulled_tokens(p)) / PUBLISHED_TURNS)
    share = (PUBLISHED_TURNS - 1) / PUBLISHED_TURNS
    target = list(PUBLISHED_PREFILL_ON_S)
    for _ in range(rounds):
        extra = [t - k for t, k in zip(target, known, strict=True)]
        per_token = max(0.0, (extra[1] - extra[0]) / (pulled[1] - pulled[0]))
        fixed = max(0.0, (extra[0] - per_token * pulled[0]) / share)
        fit = GpuFit(fit.mfu, fit.request_overhead_s, fixed, per_token)
        sims = [
            published_run(p, "on", h200_qwen3_32b(fit=fit))["p_leg_mean"] for p in PUBLISHED_PREFIX
        ]
        target = [
            t + (pub - s) for t, pub, s in zip(target, PUBLISHED_PREFILL_ON_S, sims, strict=True)
        ]
    return fit


def gpu_table() -> list[dict[str, Any]]:
    """One row per prefix: simulated TTFT off and on, with the published value and the
    error where one is published."""
    rows = []
    for prefix in SWEEP:
        row: dict[str, Any] = {"prefix": prefix}
        for leg in ("off", "on"):
            sim = published_point(prefix, leg)
            row[f"{leg}_sim_s"] = sim
            if prefix in PUBLISHED_PREFIX:
                pub = PUBLISHED_TTFT_S[leg][PUBLISHED_PREFIX.index(prefix)]
                row[f"{leg}_pub_s"] = pub
                row[f"{leg}_err"] = sim / pub - 1
        rows.append(row)
    return rows


def gpu_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| prefix | off: simulated | off: published | error | on: simulated | on: published "
        "| error |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ms(row: dict[str, Any], key: str) -> str:
        return f"{row[key] * 1000:.0f} ms" if key in row else ""

    def pct(row: dict[str, Any], key: str) -> str:
        return f"{row[key] * 100:+.0f} %" if key in row else ""

    for r in rows:
        lines.append(
            f"| {r['prefix']:,} | {ms(r, 'off_sim_s')} | {ms(r, 'off_pub_s')} | "
            f"{pct(r, 'off_err')} | {ms(r, 'on_sim_s')} | {ms(r, 'on_pub_s')} | "
            f"{pct(r, 'on_err')} |"
        )
    return "\n".join(lines)
