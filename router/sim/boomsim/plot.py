"""The one picture: each policy's follow-up TTFT against the P:D ratio, labelled simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLOTTED = (
    "plain",
    "affinity",
    "cpu-tier",
    "decode-first-2048",
    "decode-first-8192",
    "dynamo-load",
    "static",
    "adaptive",
)
"""The policies drawn (the tables have every one): a line per colour of the default cycle."""


def pd_ratio(rows: list[dict[str, Any]], out: Path) -> Path:
    """Follow-up TTFT p50 and p99 per policy across the ratio sweep's P:D ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = list(dict.fromkeys(r["ratio"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, key, title in ((axes[0], "follow_p50", "p50"), (axes[1], "follow_p99", "p99")):
        for policy in PLOTTED:
            ys = [
                next(r[key] for r in rows if r["ratio"] == x and r["policy"] == policy)
                for x in ratios
            ]
            ax.plot(range(len(ratios)), [y * 1000 for y in ys], marker="o", label=policy)
        ax.set_xticks(range(len(ratios)), ratios)
        ax.set_yscale("log")
        ax.set_title(f"follow-up TTFT {title}")
        ax.set_xlabel("P:D ratio")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        "SIMULATED (router/sim): Qwen3-32B TP8 on H200, agentic sessions; "
        "GPU profile fitted to published figures",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
