"""The equal-engine comparison's tables and plot: Boomerang's default against the policies peers
ship, all on Boomerang's engines (pure but for the plot's file).

Why its own report: against stock engines half of every ratio is one engine fix (NIXL's progress
thread), so the question users need answered is the router's own share: on engines as fast as
ours, does choosing the path per turn beat llm-d's decode-first, Dynamo's conditional
disaggregation and affinity? The answer comes as SLO goodput first (`slo.py`), then
every figure against the best peer for that figure (a frontier no single peer reaches), each
ratio read against the noise band that the default mode run twice (`AA`) measured in the same
sitting: a ratio inside it is a tie, not a win or a loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.production import slo
from bench.production.pooled import lost_total, median_of

FIGURES = (
    "first-turn TTFT p50",
    "follow-up TTFT p50",
    "follow-up TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "wall",
)
TARGETS = {
    "SLO goodput": 1.0,
    "follow-up TTFT p50": 0.9,
    "follow-up TTFT p99": 1.0,
    "first-turn TTFT p50": 1.05,
    "TPOT p50": 1.05,
    "TPOT p99": 1.2,
    "wall": 1.0,
}
"""Issue 48's targets against the best peer (goodput: at least; the rest: at most)."""
FORGETTING = ("agentic", "pressure")
"""Regimes where P forgets the histories D holds, and the stricter targets there."""
WHERE_P_FORGETS = {"SLO goodput": 1.5, "follow-up TTFT p50": 0.5}
DECIDES = ("decode-first", "dynamo")
"""Peers whose rule sends some turns to the decoder alone: 'never fired' where none went."""


def noise(modes: Mapping[str, Mapping[str, Any]], mode: str, twin: str) -> dict[str, float]:
    """Per figure, how far the twin's median lies from the mode's (|ratio - 1|): what the same
    configuration measures twice in one sitting."""
    out = {}
    for figure in ("SLO goodput", *FIGURES):
        a, b = median_of(modes.get(mode), figure), median_of(modes.get(twin), figure)
        if a and b:
            out[figure] = abs(b / a - 1)
    return out


def best(
    modes: Mapping[str, Mapping[str, Any]], peers: Sequence[str], figure: str
) -> tuple[str, float] | None:
    """The peer with the best median of `figure` (highest goodput, lowest otherwise)."""
    found = [(v, p) for p in peers if (v := median_of(modes.get(p), figure)) is not None]
    if not found:
        return None
    value, name = max(found) if figure == "SLO goodput" else min(found)
    return name, value


def cell(regime: str, modes: Mapping[str, Any], mode: str, peers: Sequence[str],
         figure: str, band: Mapping[str, float]) -> str:  # fmt: skip
    """`mode` against the best peer on one figure: ratio, the peer, 'tie' inside the noise
    band, bold where the target is missed."""
    mine, top = median_of(modes.get(mode), figure), best(modes, peers, figure)
    if mine is None or top is None or not top[1]:
        return "-"
    ratio = mine / top[1]
    forgets = regime.split(",")[0] in FORGETTING
    target = (WHERE_P_FORGETS if forgets else TARGETS).get(figure, TARGETS[figure])
    missed = ratio < target if figure == "SLO goodput" else ratio > target
    text = f"{ratio:.2f}x vs {top[0]}"
    if never_fired(top[0], modes[top[0]]):
        text += " (never fired: affinity in effect)"
    if figure in band and abs(ratio - 1) <= band[figure]:
        text += " (tie)"
    return f"**{text}**" if missed else text


def headline(
    pooled: Mapping[str, Mapping[str, Mapping[str, Any]]], mode: str, peers: Sequence[str],
    twin: str,
) -> str | None:  # fmt: skip
    """A row per regime that ran `mode` and a peer: goodput, then each figure, then lost turns
    as a total; None where no regime did."""
    cols = ("SLO goodput", *FIGURES)
    rows = []
    for regime, modes in pooled.items():
        if mode not in modes or not any(p in modes for p in peers):
            continue
        band = noise(modes, mode, twin)
        cells = [cell(regime, modes, mode, peers, f, band) for f in cols]
        own = modes[mode]
        lost = lost_total(own)
        cells.append("-" if lost is None else (f"**{lost}**" if lost else "0") +
                     f" in {own['runs']} runs")  # fmt: skip
        rows.append(f"| {regime} | " + " | ".join(cells) + " |")
    if not rows:
        return None
    head = "| regime | " + " | ".join(cols) + " | lost turns |\n" + "|---" * (len(cols) + 2)
    return head + "|\n" + "\n".join(rows)


def never_fired(name: str, m: Mapping[str, Any]) -> bool:
    """A decode-first rule that sent no turn to the decoder alone: affinity under its name."""
    return m.get("d_alone_total") == 0 and any(d in name for d in DECIDES)


def fired(name: str, m: Mapping[str, Any]) -> str:
    """How many turns the decoder served alone, and 'never fired' for a decode-first rule
    that sent none there (it ran as affinity under another name)."""
    total, share = m.get("d_alone_total"), m.get("d_alone_share")
    if total is None:
        return "-"
    text = f"{total:.0f} ({share:.0%})" if share is not None else f"{total:.0f}"
    return text + ", never fired" if never_fired(name, m) else text


def slo_table(regime: str, modes: Mapping[str, Mapping[str, Any]], twin: str, mode: str) -> str:
    """A regime's goodput, attainment and D-alone turns per mode, with the A/A band."""
    head = (
        f"regime: {regime}, SLO scale {slo.GOODPUT_SCALE:g} (TTFT: that many idle prefills of "
        "the turn's prompt; TPOT: that many idle decoder TPOTs)\n\n"
        "| mode | runs | SLO goodput (turns/s) | attainment | turns on D alone | "
        "P tokens/s at 1024 |\n|---|---|---|---|---|---|\n"
    )
    rows = []
    for name, m in modes.items():
        good, reach, rate = m.get("goodput"), m.get("attainment"), m.get("p_tokens_per_s")
        rows.append(
            f"| {name} | {m['runs']} | {_range(good, '{:.3f}')} | {_range(reach, '{:.0%}')} | "
            f"{fired(name, m)} | {_range(rate, '{:,.0f}')} |"
        )
    band = noise(modes, mode, twin)
    note = ""
    if band:
        spread = ", ".join(f"{f} {v:.0%}" for f, v in band.items())
        note = f"\n\nA/A ({twin} against {mode}, one configuration twice): {spread}."
    return head + "\n".join(rows) + note


def _range(r: Mapping[str, float] | None, fmt: str) -> str:
    if not r:
        return "-"
    return f"{fmt.format(r['median'])} ({fmt.format(r['min'])}-{fmt.format(r['max'])})"


def chart(pooled: Mapping[str, Mapping[str, Mapping[str, Any]]], out: Path) -> bool:
    """SLO attainment against the SLO scale, a panel per regime, a line per mode (False: no
    run had a basis, nothing drawn)."""
    regimes = [r for r, modes in pooled.items() if any(m.get("attainment_curve")
                                                       for m in modes.values())]  # fmt: skip
    if not regimes:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(7.5, 5.5 * len(regimes))
    fig, grid = plt.subplots(1, len(regimes), figsize=(width, 4.4), squeeze=False)
    for ax, regime in zip(grid[0], regimes, strict=True):
        for name, m in pooled[regime].items():
            if values := m.get("attainment_curve"):
                style = "-" if name.startswith("adaptive") else "--"
                ax.plot(slo.SCALES, values, style, marker=".", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("SLO scale (x idle prefill of the prompt; x idle TPOT)")
        ax.set_ylabel("turns meeting both SLOs")
        ax.set_ylim(0, 1.02)
        ax.axvline(slo.GOODPUT_SCALE, color="grey", lw=0.6)
        ax.set_title(regime)
    grid[0][0].legend(fontsize=7)
    fig.suptitle("SLO attainment on equal engines (vLLM's client; median over runs)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True
