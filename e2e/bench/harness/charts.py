"""The line charts the engine benchmarks draw: one figure, a line per mode, saved as a PNG.

Why one helper: every chart of a benchmark family must read alike (size, grid, legend,
resolution), and matplotlib's setup (a non-interactive backend, closing the figure so a long
sweep does not hold every one in memory) is easy to get subtly wrong in one copy of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def lines(
    out: Path,
    x: Sequence[float],
    series: Mapping[str, tuple[Sequence[float], str]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    log: bool = False,
) -> None:
    """`series` maps a label to its y values and a matplotlib style (`"o--"`); `log` puts both
    axes on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, (y, style) in series.items():
        ax.plot(x, y, style, label=label)
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both" if log else "major")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
