"""What one replay of the agent workload measured, as numbers, a table and a chart (pure).

Kept apart from the runner (`bench_agents.py`, which does the I/O) so the arithmetic is tested
without engines, and so that result files of separate runs (static and adaptive) are
summarised and compared by the same code: `--compare a.json b.json` reads only these files.

- TTFT p50 / p99 per suffix bucket: a follow-up turn's bucket is the size of its new suffix;
  turn 1 (nothing to reuse) is its own row. Percentiles are nearest-rank: with n turns in a
  row, p99 is the slowest one until n reaches 100.
- Share of turns per outcome: the router's reuse outcome of each turn (hit, partial, miss,
  expired, rejected, fallback), `error` when the turn failed, `unknown` when the router
  logged no line for it; and per path the router took (pull, recompute, continue).
- Hit rate: follow-up turns (turn 1 can only miss) that found their history retained and
  verified (`found_retained`), whatever path then served them. Beside it, for an adaptive
  router that keeps released handles for D's prefix cache: the share of follow-ups continued
  on D after their lease was released (`served_from_cache`), and the two together.
- D's retained KV: the integral over time of D's used KV blocks, sampled from D's own
  `vllm:kv_cache_usage_perc`, by the trapezoid rule, with a bound on the sampling error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BUCKETS: tuple[tuple[str, float], ...] = (
    ("<=64", 64),
    ("<=256", 256),
    ("<=1024", 1024),
    (">1024", math.inf),
)
FIRST = "turn 1"
OUTCOMES = (
    "hit",
    "partial",
    "miss",
    "expired",
    "rejected",
    "fallback",
    "cached",
    "error",
    "unknown",
)
"""The router's reuse outcomes, `error` (the turn failed) and `unknown` (no router log line)."""


def bucket(record: dict[str, Any]) -> str:
    """The row of one turn record: turn 1, else by the size of its new suffix."""
    if record["turn"] == 1:
        return FIRST
    return next(name for name, top in BUCKETS if record["new_tokens"] <= top)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def block_seconds(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The integral of used blocks over time from (time, used blocks) samples, and its bound.

    The gauge is exact at each sample; between two samples the trapezoid assumes a straight
    line. A change of J blocks at an unknown moment inside an interval of length dt is then off
    by at most J * dt / 2, so the bound is half the sum of |change| * dt over the intervals.
    (Blocks D retains live for the TTL, far longer than an interval, so no change goes unseen.)"""
    area = bound = 0.0
    for (t0, u0), (t1, u1) in itertools.pairwise(samples):
        dt = t1 - t0
        area += (u0 + u1) / 2 * dt
        bound += abs(u1 - u0) * dt / 2
    return area, bound


def found_retained(record: dict[str, Any]) -> bool:
    """Whether the turn found its history retained and verified: a hit or a partial, or (an
    adaptive router) a verified handle it chose to recompute past because that was cheaper.
    The hit rate counts these, so it measures retention, whatever path then served the turn."""
    return record["outcome"] in ("hit", "partial") or record.get("chosen") == "recompute"


def served_from_cache(record: dict[str, Any]) -> bool:
    """Whether the turn's handle had been released and the router continued it on D, whose
    prefix cache still held what it had not evicted (outcome `cached`)."""
    return record["outcome"] == "cached"


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT per bucket, share per outcome and the hit rate of one run's turn records."""
    rows = []
    for name in (FIRST, *(b for b, _ in BUCKETS), "all"):
        these = [r for r in records if name == "all" or bucket(r) == name]
        ttfts = [r["ttft_s"] for r in these if r["outcome"] != "error"]
        reused = sum(r["outcome"] in ("hit", "partial") for r in these)
        rows.append(
            {
                "bucket": name,
                "turns": len(these),
                "p50_s": percentile(ttfts, 50) if ttfts else None,
                "p99_s": percentile(ttfts, 99) if ttfts else None,
                "reused": reused / len(these) if these else None,
            }
        )
    total = len(records) or 1
    shares = {o: sum(r["outcome"] == o for r in records) / total for o in OUTCOMES}
    follow = [r for r in records if r["turn"] > 1]
    hits = sum(found_retained(r) for r in follow)
    cached = sum(served_from_cache(r) for r in follow)
    paths = sorted({str(r["path"]) for r in records if r.get("path")})
    return {
        "rows": rows,
        "shares": shares,
        "path_shares": {p: sum(r.get("path") == p for r in records) / total for p in paths},
        "hit_rate": hits / len(follow) if follow else None,
        "cache_rate": cached / len(follow) if follow else None,
        "reuse_rate": (hits + cached) / len(follow) if follow else None,
        "turns": len(records),
        "errors": sum(r["outcome"] == "error" for r in records),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """One markdown table per aspect, a column group per run (its label)."""
    labels = [r["label"] for r in results]
    head = "| suffix | turns | " + " | ".join(f"{lb} p50 / p99 (ms)" for lb in labels) + " |"
    lines = [head, "|---|---|" + "---|" * len(labels)]
    for i, row in enumerate(results[0]["summary"]["rows"]):
        cells = [
            f"{_ms(r['summary']['rows'][i]['p50_s'])} / {_ms(r['summary']['rows'][i]['p99_s'])}"
            for r in results
        ]
        lines.append(f"| {row['bucket']} | {row['turns']} | " + " | ".join(cells) + " |")
    lines += ["", "| | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for outcome in OUTCOMES:
        if any(r["summary"]["shares"].get(outcome) for r in results):  # older files lack some
            cells = [_pct(r["summary"]["shares"].get(outcome, 0.0)) for r in results]
            lines.append(f"| share {outcome} | " + " | ".join(cells) + " |")
    for path in sorted({p for r in results for p in r["summary"].get("path_shares", {})}):
        cells = [_pct(r["summary"].get("path_shares", {}).get(path, 0.0)) for r in results]
        lines.append(f"| share path {path} | " + " | ".join(cells) + " |")
    lines.append("| hit rate (turns 2+) | " + _cells(results, "hit_rate") + " |")
    if any(r["summary"].get("cache_rate") for r in results):
        lines.append("| after release, from D's cache | " + _cells(results, "cache_rate") + " |")
        lines.append("| reuse rate (either) | " + _cells(results, "reuse_rate") + " |")
    kv = [r["kv"] for r in results]
    lines.append(
        "| D retained KV (block-s) | "
        + " | ".join(f"{k['block_s']:.0f} ± {k['error_block_s']:.0f}" for k in kv)
        + " |"
    )
    lines.append(
        "| D peak used blocks | " + " | ".join(f"{k['peak_blocks']:.0f}" for k in kv) + " |"
    )
    pulled = [r["p_tokens"] for r in results]
    lines.append(
        "| P prompt tokens pulled / computed | "
        + " | ".join(f"{p['pulled']:.0f} / {p['computed']:.0f}" for p in pulled)
        + " |"
    )
    return "\n".join(lines)


def _cells(results: Iterable[dict[str, Any]], key: str) -> str:
    return " | ".join(_pct(r["summary"].get(key)) for r in results)


def draw(results: Sequence[dict[str, Any]], path: Path) -> None:
    """TTFT p50 and p99 per suffix bucket, one bar pair per run, and D's retained KV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["bucket"] for row in results[0]["summary"]["rows"] if row["bucket"] != "all"]
    fig, (ax, kv_ax) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(results)
    for j, res in enumerate(results):
        rows = {r["bucket"]: r for r in res["summary"]["rows"]}
        xs = [i + (j - (len(results) - 1) / 2) * width for i in range(len(names))]
        p50 = [(rows[n]["p50_s"] or 0.0) * 1000 for n in names]
        p99 = [(rows[n]["p99_s"] or 0.0) * 1000 for n in names]
        ax.bar(xs, p99, width, alpha=0.35, color=f"C{j}", label=f"{res['label']} p99")
        ax.bar(xs, p50, width, color=f"C{j}", label=f"{res['label']} p50")
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_xlabel("new tokens in the turn (turn 1: the whole prompt)")
    ax.set_ylabel("TTFT through the router (ms, log)")
    ax.set_title("Agent workload: TTFT by suffix size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    labels = [r["label"] for r in results]
    kv_ax.bar(
        labels, [r["kv"]["block_s"] for r in results], color=[f"C{j}" for j in range(len(results))]
    )
    kv_ax.set_ylabel("D's retained KV (block-seconds)")
    kv_ax.set_title("Retention on D")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
