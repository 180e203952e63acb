"""What one run of the production benchmark measured, and the table and chart of a sitting (pure).

Kept apart from `bench_production.py` (which starts engines and routers and runs vLLM's
client) so the arithmetic is tested alone. A run's records are the client's own per-request
stats (`--stats-json-output`): `ttft_ms`, `latency_ms`, `start_time_ms`, `input_num_turns`
(1 on a conversation's first turn, 3 on its second, ...). A turn is *stalled* when its TTFT is
over the sitting's stall bound (derived from P's measured prefill speed: several times the
longest prompt's prefill, so only waiting, never computing, crosses it).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linearly interpolated (numpy's default); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(at), math.ceil(at)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


def summarize(records: Sequence[Mapping[str, Any]], stall_bound_s: float) -> dict[str, Any]:
    """TTFT (first turns, follow-ups), end-to-end latency, wall, turns/s and stalls, in s."""
    first = [r["ttft_ms"] / 1000 for r in records if r["input_num_turns"] <= 1]
    follow = [r["ttft_ms"] / 1000 for r in records if r["input_num_turns"] > 1]
    latency = [r["latency_ms"] / 1000 for r in records]
    starts = [r["start_time_ms"] / 1000 for r in records]
    ends = [(r["start_time_ms"] + r["latency_ms"]) / 1000 for r in records]
    wall = max(ends) - min(starts) if records else 0.0
    return {
        "turns": len(records),
        "first_ttft_s": _spread(first),
        "followup_ttft_s": _spread(follow),
        "latency_s": _spread(latency),
        "wall_s": wall,
        "turns_per_s": len(records) / wall if wall > 0 else 0.0,
        "stalled": sum(1 for r in records if r["ttft_ms"] / 1000 > stall_bound_s),
    }


def block_seconds(points: Sequence[tuple[float, float]]) -> float:
    """The area under a series of (time, blocks) samples (trapezoids)."""
    return sum((t1 - t0) * (b0 + b1) / 2 for (t0, b0), (t1, b1) in itertools.pairwise(points))


def pooled(runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One mode's runs of a regime: the median of each figure over its runs."""
    runs = list(runs)

    def med(path: tuple[str, ...]) -> float | None:
        values = []
        for run in runs:
            value: Any = run
            for key in path:
                value = value.get(key) if isinstance(value, Mapping) else None
            if isinstance(value, int | float):
                values.append(float(value))
        return median(values) if values else None

    out: dict[str, Any] = {"runs": len(runs)}
    for part in ("first_ttft_s", "followup_ttft_s", "latency_s"):
        out[part] = {f"p{q}": med(("summary", part, f"p{q}")) for q in PERCENTILES}
    for key in ("wall_s", "turns_per_s", "stalled"):
        out[key] = med(("summary", key))
    out["retained_block_s"] = med(("retained_block_s",))
    for role in ("p", "d"):
        for source in ("computed", "cached", "pulled"):
            out[f"{role}_{source}"] = med(("tokens", role, source))
    return out


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def table(regime: str, modes: Mapping[str, Mapping[str, Any]], better: str | None) -> str:
    """The markdown table of one regime: a row per mode, ratios against `better` (the better
    baseline by follow-up TTFT p50)."""
    head = (
        f"regime: {regime}\n\n"
        "| mode | follow-up TTFT p50 / p90 / p99 | vs best baseline p50 / p99 | first-turn "
        "TTFT p50 / p99 | latency p50 | wall | turns/s | stalled | P computed / cached / "
        "pulled | D computed / cached | D retained block-s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    base = modes.get(better or "") or {}
    rows = []
    for mode, m in modes.items():
        f, first = m["followup_ttft_s"], m["first_ttft_s"]
        rows.append(
            f"| {mode} | {_s(f['p50'])} / {_s(f['p90'])} / {_s(f['p99'])} | "
            f"{_ratio(f['p50'], base, 'p50')} / {_ratio(f['p99'], base, 'p99')} | "
            f"{_s(first['p50'])} / {_s(first['p99'])} | {_s(m['latency_s']['p50'])} | "
            f"{_s(m['wall_s'])} | {m['turns_per_s'] or 0:.2f} | {_n(m['stalled'])} | "
            f"{_n(m['p_computed'])} / {_n(m['p_cached'])} / {_n(m['p_pulled'])} | "
            f"{_n(m['d_computed'])} / {_n(m['d_cached'])} | {_n(m['retained_block_s'])} |"
        )
    return head + "\n".join(rows)


def _ratio(value: float | None, base: Mapping[str, Any], key: str) -> str:
    ref = (base.get("followup_ttft_s") or {}).get(key)
    if value is None or not ref:
        return "-"
    return f"{value / ref:.2f}"


def best_baseline(modes: Mapping[str, Mapping[str, Any]], baselines: Sequence[str]) -> str | None:
    """The baseline with the lowest follow-up TTFT p50."""
    present = [b for b in baselines if (modes.get(b) or {}).get("followup_ttft_s", {}).get("p50")]
    return min(present, key=lambda b: modes[b]["followup_ttft_s"]["p50"]) if present else None


def chart(results: Mapping[str, Mapping[str, Mapping[str, Any]]], out: Path) -> None:
    """Follow-up TTFT p50 and p99 per mode, one panel per regime (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(results)
    fig, axes = plt.subplots(1, len(regimes), figsize=(4.5 * len(regimes), 3.6), squeeze=False)
    for ax, regime in zip(axes[0], regimes, strict=True):
        modes = results[regime]
        names = list(modes)
        p50 = [modes[n]["followup_ttft_s"]["p50"] or 0 for n in names]
        p99 = [modes[n]["followup_ttft_s"]["p99"] or 0 for n in names]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
        ax.set_xticks(list(xs), names, rotation=20)
        ax.set_yscale("log")
        ax.set_title(regime)
        ax.set_ylabel("follow-up TTFT (s)")
    axes[0][0].legend()
    fig.suptitle("vLLM multi-turn benchmark client, prefix caching on")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
