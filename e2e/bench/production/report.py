"""What one run of the production benchmark measured, and the tables and chart of a sitting (pure).

Kept apart from `bench_production.py` (which starts engines and routers and runs vLLM's
client) so the arithmetic is tested alone. A run's records are the client's own per-request
stats (`--stats-json-output`): `ttft_ms`, `tpot_ms`, `latency_ms`, `start_time_ms`,
`output_num_tokens`, `input_num_turns` (1 on a conversation's first turn, 3 on its second,
...). A turn the client never recorded (it failed, or its client gave up) is *lost*: the runs
know how many turns the conversations have. A turn is *stalled* when its TTFT is over the
sitting's stall bound (several times the longest prompt's measured prefill, so only waiting,
never computing, crosses it).

Every figure is pooled over a mode's runs as its median with the min and max beside it, so a
ratio inside the noise reads as one; ratios compare the default mode with the *strongest*
baseline for that figure (the best baseline value, figure by figure).
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from bench.production import equal, slo
from bench.production.pooled import lost_total, median_of

PERCENTILES = (50, 90, 99)
FIGURES: dict[str, tuple[str, ...]] = {
    "first-turn TTFT p50": ("first_ttft_s", "p50"),
    "first-turn TTFT p99": ("first_ttft_s", "p99"),
    "follow-up TTFT p50": ("followup_ttft_s", "p50"),
    "follow-up TTFT p90": ("followup_ttft_s", "p90"),
    "follow-up TTFT p99": ("followup_ttft_s", "p99"),
    "TPOT p50": ("tpot_s", "p50"),
    "TPOT p99": ("tpot_s", "p99"),
    "wall": ("wall_s",),
    "lost turns": ("lost",),
    "stalled turns": ("stalled",),
}
"""Every figure a user weighs, lower is better for all (path into a run's summary)."""
HEADLINE = (
    "first-turn TTFT p50",
    "follow-up TTFT p50",
    "follow-up TTFT p99",
    "TPOT p50",
    "wall",
    "lost turns",
)
TARGETS = {
    "follow-up TTFT p50": 0.8,
    "first-turn TTFT p50": 1.1,
    "follow-up TTFT p99": 1.0,
    "TPOT p50": 1.1,
    "wall": 1.0,
}
"""The ratio each figure must stay under against the strongest baseline (lost turns: 0)."""


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


def summarize(
    records: Sequence[Mapping[str, Any]],
    stall_bound_s: float,
    expected: int | None = None,
    answered: int | None = None,
) -> dict[str, Any]:
    """TTFT (first turns, follow-ups), TPOT, end-to-end latency, wall, turns/s, stalls and lost
    turns (`expected` less those the client answered, or less those recorded when it did not
    say), in s."""
    done = len(records) if answered is None else max(answered, len(records))
    first = [r["ttft_ms"] / 1000 for r in records if r["input_num_turns"] <= 1]
    follow = [r["ttft_ms"] / 1000 for r in records if r["input_num_turns"] > 1]
    tpot = [r["tpot_ms"] / 1000 for r in records if r.get("output_num_tokens", 0) > 1]
    latency = [r["latency_ms"] / 1000 for r in records]
    starts = [r["start_time_ms"] / 1000 for r in records]
    ends = [(r["start_time_ms"] + r["latency_ms"]) / 1000 for r in records]
    wall = max(ends) - min(starts) if records else 0.0
    return {
        "turns": len(records),
        "answered": done,
        "expected": expected if expected is not None else done,
        "lost": max(0, expected - done) if expected is not None else 0,
        "first_ttft_s": _spread(first),
        "followup_ttft_s": _spread(follow),
        "tpot_s": _spread(tpot),
        "latency_s": _spread(latency),
        "wall_s": wall,
        "turns_per_s": len(records) / wall if wall > 0 else 0.0,
        "stalled": sum(1 for r in records if r["ttft_ms"] / 1000 > stall_bound_s),
    }


def block_seconds(points: Sequence[tuple[float, float]]) -> float:
    """The area under a series of (time, blocks) samples (trapezoids)."""
    return sum((t1 - t0) * (b0 + b1) / 2 for (t0, b0), (t1, b1) in itertools.pairwise(points))


def _at(run: Mapping[str, Any], path: Sequence[str]) -> float | None:
    value: Any = run
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, int | float) else None


def pooled(
    runs: Sequence[Mapping[str, Any]], basis: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """One mode's runs of a regime: each figure's min, median and max over the runs, and the
    median of the engines' token counts and CPU seconds; SLO goodput and attainment against
    `basis` (the regime's, `slo.regime_basis`; None: each run's own)."""
    out: dict[str, Any] = {"runs": len(runs), "figures": {}}
    for name, path in FIGURES.items():
        values = [v for r in runs if (v := _at(r, ("summary", *path))) is not None]
        out["figures"][name] = _range(values)
    extra: dict[str, tuple[str, ...]] = {
        "retained_block_s": ("retained_block_s",),
        "turns_per_s": ("summary", "turns_per_s"),
        **{f"{r}_{s}": ("tokens", r, s) for r in "pd" for s in ("computed", "cached", "pulled")},
        **{f"cpu_{r}": ("cpu_s", r) for r in ("prefill", "decode")},
    }
    for key, path in extra.items():
        values = [v for r in runs if (v := _at(r, path)) is not None]
        out[key] = median(values) if values else None
    lost = [int(v) for r in runs if (v := _at(r, ("summary", "lost"))) is not None]
    out["lost_total"], out["lost_max"] = sum(lost), max(lost, default=0)
    good = [g for r in runs if (g := slo.goodput(r, basis=basis)) is not None]
    out["goodput"] = _range(good)
    reach = [a for r in runs if (a := slo.attainment(r, slo.GOODPUT_SCALE, basis)) is not None]
    out["attainment"] = _range(reach)
    out["attainment_curve"] = slo.curve(runs, basis=basis)
    alone = [a for r in runs if (a := slo.d_alone(r)) is not None]
    out["d_alone_total"] = sum(alone) if alone else None
    answered = [_at(r, ("summary", "answered")) or 0.0 for r in runs if slo.d_alone(r) is not None]
    out["d_alone_share"] = sum(alone) / sum(answered) if alone and sum(answered) else None
    rates = [v for r in runs if (v := _at(r, ("p_tokens_per_s_at_1024",))) is not None]
    out["p_tokens_per_s"] = _range(rates)
    return out


def _range(values: Sequence[float]) -> dict[str, float] | None:
    return {"min": min(values), "median": median(values), "max": max(values)} if values else None


def exclude(res: dict[str, Any], serials: set[int], why: str) -> None:
    """Leave runs out of the pooled figures (kept under `excluded_runs`, with why): a run the
    sitting later found disturbed (another process on its cores) is shown, not counted."""
    kept = [r for r in res["runs"] if r["serial"] not in serials]
    for run in res["runs"]:
        if run["serial"] in serials:
            res.setdefault("excluded_runs", []).append({**run, "excluded_because": why})
    res["runs"] = kept
    repool(res)


def repool(res: dict[str, Any]) -> None:
    """Pool the results' runs again, in the order their regimes were published (results
    pooled by an older version gain what it did not keep, such as lost-turn totals)."""
    again = pooled_by_regime(res["runs"])
    res["pooled"] = {regime: again.get(regime, {}) for regime in res["pooled"]}


def pooled_by_regime(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every regime's modes pooled (`pooled`), in the order the runs first name them."""
    groups: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for run in runs:
        groups.setdefault(run["regime"], {}).setdefault(run["mode"], []).append(run)
    out = {}
    for regime, modes in groups.items():
        basis = slo.regime_basis([r for mode_runs in modes.values() for r in mode_runs])
        out[regime] = {mode: pooled(mode_runs, basis) for mode, mode_runs in modes.items()}
    return out


def strongest(
    modes: Mapping[str, Mapping[str, Any]], baselines: Sequence[str], figure: str
) -> tuple[str | None, float | None]:
    """The baseline with the best (lowest) median of `figure`, and that median; (None, None)
    when no baseline has it."""
    found = [
        (f["median"], b)
        for b in baselines
        if b in modes and (f := modes[b]["figures"].get(figure)) is not None
    ]
    if not found:
        return None, None
    value, name = min(found)
    return name, value


def ratios(
    modes: Mapping[str, Mapping[str, Any]], mode: str, baselines: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """`mode`'s median of every figure against the strongest baseline's: ratio (None when the
    baseline's is 0: then `mode`'s value itself says it, as for lost turns)."""
    out: dict[str, dict[str, Any]] = {}
    for figure in FIGURES:
        if figure == "lost turns" and (lost := _lost_ratio(modes, mode, baselines)):
            out[figure] = lost
            continue
        mine = (modes.get(mode) or {}).get("figures", {}).get(figure)
        base, value = strongest(modes, baselines, figure)
        if mine is None or base is None:
            continue
        ratio = mine["median"] / value if value else None
        out[figure] = {"baseline": base, "base": value, "mine": mine["median"], "ratio": ratio}
    return out


def _lost_ratio(
    modes: Mapping[str, Mapping[str, Any]], mode: str, baselines: Sequence[str]
) -> dict[str, Any] | None:
    """Lost turns as totals: `mode`'s over its runs, its worst run, and the fewest any
    baseline lost over its own runs (None: results pooled before totals were kept)."""
    own = modes.get(mode)
    mine = lost_total(own) if own is not None else None
    totals = [(t, b) for b in baselines if b in modes and (t := lost_total(modes[b])) is not None]
    if own is None or mine is None or not totals:
        return None
    base, name = min(totals)
    return {"baseline": name, "base": base, "mine": mine, "ratio": None,
            "max": own.get("lost_max", 0), "runs": own.get("runs", 0)}  # fmt: skip


def met(figure: str, entry: Mapping[str, Any]) -> bool | None:
    """Whether a figure meets its target (lost turns: none); None: no target."""
    if figure == "lost turns":
        return entry["mine"] == 0
    target = TARGETS.get(figure)
    if target is None:
        return None
    return entry["ratio"] is not None and entry["ratio"] <= target


def fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _fig(name: str, f: Mapping[str, float] | None) -> str:
    if f is None:
        return "-"
    if name in ("lost turns", "stalled turns"):
        return f"{f['median']:.0f} ({f['min']:.0f}-{f['max']:.0f})"
    return f"{fmt_s(f['median'])} ({fmt_s(f['min'])}-{fmt_s(f['max'])})"


def table(regime: str, modes: Mapping[str, Mapping[str, Any]]) -> str:
    """A regime's markdown table: a row per mode, every figure as median (min-max)."""
    cols = list(FIGURES)
    head = f"regime: {regime}\n\n| mode | runs | " + " | ".join(cols)
    head += " | P computed / cached / pulled | D computed / cached | CPU s P / D |\n"
    head += "|---" * (len(cols) + 5) + "|\n"
    rows = []
    for mode, m in modes.items():
        cells = [_fig(c, m["figures"].get(c)) for c in cols]
        if "lost turns" in cols and (total := lost_total(m)) is not None:
            cells[cols.index("lost turns")] = f"{total} total (worst run {m['lost_max']})"
        tokens = " / ".join(_n(m.get(f"p_{s}")) for s in ("computed", "cached", "pulled"))
        d_tokens = " / ".join(_n(m.get(f"d_{s}")) for s in ("computed", "cached"))
        cpu = f"{_n(m.get('cpu_prefill'))} / {_n(m.get('cpu_decode'))}"
        rows.append(f"| {mode} | {m['runs']} | " + " | ".join(cells) + f" | {tokens} | "
                    f"{d_tokens} | {cpu} |")  # fmt: skip
    return head + "\n".join(rows)


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def headline(
    pooled_by_regime: Mapping[str, Mapping[str, Mapping[str, Any]]], mode: str,
    baselines: Sequence[str],
) -> str:  # fmt: skip
    """One row per regime: `mode` against the strongest baseline on each headline figure
    (ratio, and the baseline that was strongest); a miss of its target in bold."""
    head = "| regime | " + " | ".join(HEADLINE) + " |\n" + "|---" * (len(HEADLINE) + 1) + "|\n"
    rows = []
    for regime, modes in pooled_by_regime.items():
        r = ratios(modes, mode, baselines)
        if not r:  # none of these baselines ran in the regime (or not `mode`): no row
            continue
        cells = [_cell(figure, r.get(figure), named=True) for figure in HEADLINE]
        rows.append(f"| {regime} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows)


def _cell(figure: str, entry: Mapping[str, Any] | None, named: bool) -> str:
    """One figure's ratio (`named`: and the baseline it is against), bold where it misses its
    target; lost turns as counts."""
    if entry is None:
        return "-"
    if figure == "lost turns" and "runs" in entry:
        text = (
            f"{entry['mine']:.0f} in {entry['runs']} runs (worst run {entry['max']:.0f}; "
            f"fewest of a baseline {entry['base']:.0f})"
        )
    elif figure == "lost turns":
        text = f"{entry['mine']:.0f} (best baseline {entry['base']:.0f})"
    elif entry["ratio"]:
        text = f"{entry['ratio']:.2f}x" + (f" vs {entry['baseline']}" if named else "")
    else:
        text = "-"
    return f"**{text}**" if met(figure, entry) is False else text


CHART_COLUMNS = 4
"""Panels per row of the chart: a sitting with many regimes wraps instead of growing wide."""


def chart(results: Mapping[str, Mapping[str, Mapping[str, Any]]], out: Path) -> None:
    """Follow-up TTFT p50 and p99 and first-turn TTFT p50 per mode, a panel per regime (log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(results)
    cols = min(CHART_COLUMNS, len(regimes))
    rows = -(-len(regimes) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    panels = [ax for row in grid for ax in row]
    for ax in panels[len(regimes) :]:
        ax.set_visible(False)
    shown = (("follow-up TTFT p50", -0.27), ("follow-up TTFT p99", 0.0),
             ("first-turn TTFT p50", 0.27))  # fmt: skip
    for ax, regime in zip(panels[: len(regimes)], regimes, strict=True):
        modes = results[regime]
        names = list(modes)
        xs = range(len(names))
        for figure, dx in shown:
            values = [((modes[n]["figures"].get(figure) or {}).get("median") or 0) for n in names]
            ax.bar([x + dx for x in xs], values, 0.27, label=figure)
        ax.set_xticks(list(xs), names, rotation=35, ha="right")
        ax.set_yscale("log")
        ax.set_title(regime)
        ax.set_ylabel("seconds (median over runs)")
    panels[0].legend(fontsize=7)
    fig.suptitle("vLLM multi-turn benchmark client; stock vLLM baselines, prefix caching on")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


CHARTS = "e2e/bench/results/production"
"""Where the published charts are, as the README (at the repository's root) links them."""
CAUSES_HINT = "Causes of each loss: docs/benchmarks.md, beside the sitting's tables."


def sitting_block(res: Mapping[str, Any]) -> str:
    """The sitting's tables for docs/benchmarks.md: the headline, then every regime's modes."""
    lines = [
        f"## Sitting: {res.get('date', '')}".rstrip(": "),
        "",
        f"`{res.get('command', 'make bench-production')}`; {res['machine']}; client: "
        f"{res['client']}; {res['rounds']} round(s)"
        + (f"; source at {res['revision']}" if res.get("revision") else "")
        + ". Medians over the rounds, (min-max) beside.",
        "",
        f"`{res['default_mode']}` (the default) against the strongest baseline, figure by figure "
        "(bold: the target missed):",
        "",
        headline(res["pooled"], res["default_mode"], res["baselines"]),
        "",
    ]
    if quiet := same_engine_headline(res):
        lines += [
            f"`{res['default_mode']}` against the same policies on Boomerang's engines with "
            "bidirectional off (`@quiet`: its engine fixes without its reuse, so the ratio is "
            "the router's own):",
            "",
            quiet,
            "",
        ]
    if alone := per_policy(res):
        lines += [
            f"`{res['default_mode']}` against each of those policies alone (the strongest "
            "baseline above is picked figure by figure; a user runs one policy):",
            "",
            alone,
            "",
        ]
    lines += [block + "\n" for block in equal_blocks(res)]
    for regime, modes in res["pooled"].items():
        lines += [table(regime, modes), ""]
    return "\n".join(lines)


def equal_blocks(res: Mapping[str, Any]) -> list[str]:
    """The equal-engine comparison (`equal.py`): its headline and each regime's
    goodput table, where the sitting ran the peers' policies (else nothing)."""
    peers, twin, mode = list(res.get("peers") or ()), res.get("twin", ""), res["default_mode"]
    ran = equal_regimes(res)
    top = equal.headline(ran, mode, peers, twin)
    if top is None:
        return []
    intro = (
        f"`{mode}` against the best of the peers' policies on equal engines (Boomerang's, "
        "bidirectional off), figure by figure; SLO goodput at scale "
        f"{slo.GOODPUT_SCALE:g} (higher is better); (tie): inside the A/A noise band; bold: "
        "issue 48's target missed:"
    )
    return [intro, top, *(equal.slo_table(r, modes, twin, mode) for r, modes in ran.items())]


def same_engine_headline(res: Mapping[str, Any]) -> str | None:
    """The headline against the `@quiet` baselines, where the sitting ran any (else None)."""
    quiet = list(res.get("quiet_baselines") or ())
    ran = any(b in modes for modes in res["pooled"].values() for b in quiet)
    return headline(res["pooled"], res["default_mode"], quiet) if ran else None


def per_policy(res: Mapping[str, Any]) -> str | None:
    """The default mode against each `@quiet` policy alone, a row per regime and policy (None
    where none ran). Why: the headline's strongest baseline is chosen figure by figure, a
    frontier no single policy reaches (decode-first-512 has the best follow-ups, affinity the
    best TPOT); a user runs one policy, and this says which figures Boomerang wins against it."""
    quiet = list(res.get("quiet_baselines") or ())
    mode, shown = res["default_mode"], [f for f in HEADLINE if f != "lost turns"]
    rows = []
    for regime, modes in res["pooled"].items():
        for policy in (q for q in quiet if q in modes and mode in modes):
            r = ratios(modes, mode, [policy])
            cells = [_cell(figure, r.get(figure), named=False) for figure in shown]
            rows.append(f"| {regime} | {policy} | " + " | ".join(cells) + " |")
    if not rows:
        return None
    head = "| regime | against | " + " | ".join(shown) + " |\n" + "|---" * (len(shown) + 2)
    return head + "|\n" + "\n".join(rows)


def engine_fix(res: Mapping[str, Any], figure: str) -> tuple[float, float] | None:
    """What Boomerang's engine fixes alone give on `figure`: the range over regimes and
    policies of a policy's median on Boomerang's engines with bidirectional off (`@quiet`)
    over the same policy's on stock engines, same sitting and regime (None: none ran both)."""
    found = []
    for modes in res["pooled"].values():
        for quiet in (m for m in modes if m.endswith("@quiet")):
            stock_ = modes.get(quiet.removesuffix("@quiet"))
            a, b = (median_of(m, figure) for m in (modes[quiet], stock_))
            if a is not None and b:
                found.append(a / b)
    return (min(found), max(found)) if found else None


def equal_regimes(res: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The regimes an equal-engine sitting ran (`--equal`: its A/A twin beside the default),
    not the older sittings that ran some of the same quiet policies on earlier routers, nor
    an equal sitting kept as history under a label naming its router (`agentic, equal
    engines, router 6984497`): the headline's rows run on the current router."""
    twin = res.get("twin")
    return {
        r: modes
        for r, modes in res["pooled"].items()
        if twin and twin in modes and ", router " not in r
    }


def run_sizes(res: Mapping[str, Any], regimes: Iterable[str], mode: str) -> str | None:
    """Per regime, the conversations and follow-ups of a run of `mode` (medians), and what a
    follow-up p99 then is: with fewer than 100 follow-ups it is about the worst one."""
    sizes: dict[str, list[str]] = {}  # "N conversations and M follow-ups" -> its regimes
    for regime in regimes:
        runs = [r for r in res.get("runs", ()) if r["regime"] == regime and r["mode"] == mode]
        if not runs:
            continue
        convs = median(len({rec.get("conversation_id") for rec in r["records"]}) for r in runs)
        follow = median(sum(1 for rec in r["records"] if _follow_up(rec)) for r in runs)
        size = f"{convs:.0f} conversations and {follow:.0f} follow-ups a run"
        sizes.setdefault(size, []).append(regime.removesuffix(", equal engines"))
    if not sizes:
        return None
    parts = [f"{size} ({', '.join(names)})" for size, names in sizes.items()]
    return (
        "; ".join(parts) + ". With fewer than 100 follow-ups a run, a follow-up p99 is about "
        "the run's worst follow-up (its median over the rounds, the typical worst)."
    )


def _follow_up(record: Mapping[str, Any]) -> bool:
    return int(record.get("input_num_turns", 1)) > 1


def equal_readme_block(res: Mapping[str, Any]) -> str | None:
    """The README's headline once a sitting ran the peers on equal engines: that comparison
    first, the stock one as one line of what the engine fix alone gives (None: no peers ran)."""
    peers, mode = list(res.get("peers") or ()), res["default_mode"]
    table_ = equal.headline(equal_regimes(res), mode, peers, res.get("twin", ""))
    if table_ is None:
        return None
    names = ", ".join(p.removesuffix("@quiet") for p in peers)
    prose = textwrap.fill(
        f"vLLM's own multi-turn client ({res['client']}, fetched at run time) on real vLLM CPU "
        "engines (tiny model, 2 cores), every mode on Boomerang's engines with prefix caching "
        f"on: the default against the peers' policies with bidirectional off ({names}). Each "
        "cell: the default's median over the rounds divided by the best peer's for that "
        f"figure; SLO goodput: turns per second within {slo.GOODPUT_SCALE:g} idle prefills of "
        f"their prompt and {slo.GOODPUT_SCALE:g} idle decoder TPOTs, higher is better; (tie): "
        "inside the A/A noise band; bold: a target missed; lost turns: a total:",
        width=96,
    )
    lines = [prose, "", table_, ""]
    if sizes := run_sizes(res, equal_regimes(res), mode):
        lines += [textwrap.fill(sizes, width=96), ""]
    fix = engine_fix(res, "follow-up TTFT p50")
    first = engine_fix(res, "first-turn TTFT p50")
    if fix and first:
        lines.append(textwrap.fill(
            "Against stock vLLM engines the default's ratios are lower, but the engine fix "
            "alone (one policy, Boomerang's engines without reuse against stock) gives "
            f"{fix[0]:.2f}-{fix[1]:.2f}x on follow-up TTFT p50 and {first[0]:.2f}-{first[1]:.2f}x "
            "on first turns: a stock CPU engine loses about half a core to NIXL's busy-polling "
            "progress thread. On a GPU node that thread spins one host core per worker and "
            "leaves the GPU's prefill as fast, so none of that share carries over.",
            width=96,
        ))  # fmt: skip
        lines.append("")
    after = (
        "Causes, every mode's figures, the method and earlier sittings: `docs/benchmarks.md`; "
        "`make bench-production ARGS=--equal` reproduces it."
    )
    chart_ = f"![SLO attainment against the SLO scale]({CHARTS}/production_slo.png)"
    return "\n".join([*lines, textwrap.fill(after, width=96), "", chart_])


def readme_block(res: Mapping[str, Any]) -> str:
    """The README's headline: the equal-engine comparison where the sitting ran it
    (`equal_readme_block`), else one row per regime, each figure's ratio to its strongest
    stock baseline."""
    if (block := equal_readme_block(res)) is not None:
        return block
    ran = {m for modes in res["pooled"].values() for m in modes}
    prefix = "decode-first-"
    cuts = sorted(int(m[len(prefix) :]) for m in ran if m.startswith(prefix) and "@" not in m)
    thresholds = "/".join(map(str, cuts)) or "none run"
    prose = textwrap.fill(
        f"Measured by vLLM's own multi-turn benchmark client ({res['client']}, fetched at run "
        "time) on real vLLM CPU engines (tiny model, 2 cores). Baselines: **stock vLLM** "
        "engines (none of Boomerang's code inside) with prefix caching on, routed by vLLM's "
        "own P/D proxy, least load, conversation affinity with KV-event routing, and "
        f"decode-first (llm-d's, Dynamo's and SGLang's policy; thresholds {thresholds}). "
        f"Boomerang runs its default configuration. Each cell: the default mode's median "
        f"over {res['rounds']} round(s) divided by the strongest baseline's for that figure "
        "(lower is better; bold: a target missed; lost turns: a total):",
        width=96,
    )
    table_ = headline(res["pooled"], res["default_mode"], res["baselines"])
    if quiet := same_engine_headline(res):
        table_ += "\n\nThe same, against those policies on Boomerang's engines without its "
        table_ += "reuse (`@quiet`; the router's own share: on CPU a stock engine loses about "
        table_ += "half its core to NIXL's busy-polling progress thread; on a GPU node that "
        table_ += "thread spins a host core per worker but leaves the GPU's prefill as fast):"
        table_ += f"\n\n{quiet}"
    after = (
        f"{CAUSES_HINT} `make bench-production` reproduces it; the method, every mode's "
        "figures with their spread, and the earlier sittings: `docs/benchmarks.md`."
    )
    chart_ = f"![First-turn and follow-up TTFT per mode and regime]({CHARTS}/production.png)"
    return "\n".join([prose, "", table_, "", textwrap.fill(after, width=96), "", chart_])


def splice(text: str, start: str, end: str, block: str) -> str:
    """`text` with what lies between the `start` and `end` markers replaced by `block`."""
    head, _, rest = text.partition(start)
    _, found, tail = rest.partition(end)
    if not found:
        raise ValueError(f"markers {start} ... {end} not found")
    return f"{head}{start}\n{block}\n{end}{tail}"
