"""The simulator against this project's CPU engines: the fair benchmark's runs predicted.

Why: a simulator is worth its error, and the one place its engine model can be checked against
real engines running the router's peers is the production benchmark's equal-engine sittings
(`e2e/bench/results/production/`). Each of their runs is replayed here with nothing fitted to
the figures compared: the CPU profile comes from what the run's engine set measured when idle
(`profiles.cpu_engines`: P's prefill time, D's idle TPOT), the conversations are the ones vLLM's
client sent, turn by turn, with the prompt and answer lengths it recorded, and the load is the
regime's closed-loop clients on its topology and KV blocks. So a gap is the engine model's (or
the policy's) alone, not the workload generator's.

No idle measure gives how D's decode step grows with its batch and the KV it holds, so that
one is measured from the benchmark itself, on one regime and policy only (`FIT_ON`: pressure
under affinity, where D does nothing but decode and read P's KV, at the benchmark's highest
concurrency): each request's time per output token against the streams decoding beside it
and the KV they hold, by least squares (`decode_step`). Every other row is a prediction.

The policies replayed are the peers' that move no KV from D to P (affinity, decode-first at
each threshold, Dynamo's rule and its load variant): a D->P pull on the CPU engines is
measured once (`profiles.CPU_PULL_4K_S`), not per engine set. A figure is predicted within the
tolerance when the simulated median over a regime's runs is within 25 % of the measured one.
Pure apart from `load`.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boomerang.router.learning.wls import solve
from boomsim.cluster import Topology
from boomsim.policies import Settings
from boomsim.profiles import DecodeStep, cpu_engines
from boomsim.run import Load, run
from boomsim.workload import Turns

from bench.production import modes, slo, store

EQUAL = ", equal engines"
"""The label of a regime's current equal-engine sitting (older ones add `, router <commit>`)."""
POLICIES = {
    "affinity@quiet": "affinity",
    "decode-first-512@quiet": "decode-first-512",
    "decode-first-2048@quiet": "decode-first-2048",
    "decode-first-8192@quiet": "decode-first-8192",
    "dynamo@quiet": "dynamo",
    "dynamo-load@quiet": "dynamo-load",
}
"""The benchmark's peer modes and the simulator's policy for each."""
FIGURES = (
    ("first-turn TTFT p50", "first_p50"),
    ("follow-up TTFT p50", "follow_p50"),
    ("TPOT p50", "tpot_p50"),
    ("wall", "span_s"),
)
"""What is compared: the benchmark's figure and the simulator's summary key."""
TOLERANCE = 0.25
CLAIMED = ("TPOT p50", "wall")
CLAIMED_REGIMES = ("pressure", "agentic")
"""What `docs/simulation.md` claims the CPU profile predicts within the tolerance, on every row
of those regimes (`router/tests/test_sim_cpu.py`): TPOT and wall in the sitting D's step was
measured in. The TTFT figures, and the regimes of later sittings (another machine speed: the
profile's D step is that sitting's), are shown, not claimed."""
FIT_ON = ("pressure", "affinity@quiet")
"""The regime and mode D's decode step is measured on (module docs)."""


@dataclass(frozen=True)
class Row:
    regime: str
    mode: str
    runs: int
    measured: dict[str, float]
    predicted: dict[str, float]
    fitted: bool = False
    """D's decode step was measured on these runs (`FIT_ON`): its TPOT and wall are no
    prediction."""

    def ratio(self, figure: str) -> float:
        return self.predicted[figure] / self.measured[figure]

    def within(self, figure: str) -> bool:
        return abs(self.ratio(figure) - 1.0) <= TOLERANCE


def load(folder: Path) -> dict[str, Any]:
    """The published results (`bench.production.store`)."""
    return store.load(folder)


def measured(summary: Mapping[str, Any]) -> dict[str, float]:
    """A run's figures as the benchmark recorded them."""
    return {
        "first-turn TTFT p50": summary["first_ttft_s"]["p50"],
        "follow-up TTFT p50": summary["followup_ttft_s"]["p50"],
        "TPOT p50": summary["tpot_s"]["p50"],
        "wall": summary["wall_s"],
    }


def conversations(records: Sequence[Mapping[str, Any]]) -> list[Turns]:
    """The conversations vLLM's client sent, in its own conversation order: each turn's prompt
    and answer tokens as it recorded them (no think time: the client sends the next turn as
    soon as the last is answered)."""
    by_conv: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for r in records:
        turn = (r["input_num_turns"], r["input_num_tokens"], r["output_num_tokens"])
        by_conv[r["conversation_id"]].append(turn)
    return [[(p, a, 0.0) for _, p, a in sorted(turns)] for _, turns in sorted(by_conv.items())]


def topology(regime: str) -> tuple[Topology, Load]:
    """The regime's engines, KV blocks and clients, from the benchmark's own definition."""
    spec = modes.REGIMES[regime.split(",")[0]]
    topo = Topology(spec.prefill, spec.decode, spec.p_blocks, spec.d_blocks)
    clients = spec.workload.clients
    return topo, Load(clients=clients, max_active=clients)


def decode_samples(records: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, float]]:
    """Per streamed answer: (its time per output token, the streams decoding beside it on
    average over its decode, itself included, and the KV they held), from the client's
    records alone (a stream's KV: its prompt and half its answer)."""
    spans = [
        (r["start_time_ms"] + r["ttft_ms"], r["start_time_ms"] + r["latency_ms"], r)
        for r in records
        if r["output_num_tokens"] > 1 and r["latency_ms"] > r["ttft_ms"]
    ]
    out = []
    for start, end, r in spans:
        batch = kv = 0.0
        for s2, e2, r2 in spans:
            share = max(0.0, min(end, e2) - max(start, s2)) / (end - start)
            batch += share
            kv += share * (r2["input_num_tokens"] + r2["output_num_tokens"] / 2)
        out.append((r["tpot_ms"] / 1000, batch, kv))
    return out


def decode_step(runs: Sequence[Mapping[str, Any]]) -> DecodeStep:
    """D's step, `fixed + per_request * batch + per_kv_token * kv`, by least squares over the
    runs' streams (`decode_samples`)."""
    samples = [s for r in runs for s in decode_samples(r["records"])]
    if len(samples) < 3:
        raise ValueError("too few streamed answers to measure a decode step")
    rows = [(1.0, b, k) for _, b, k in samples]
    ys = [y for y, _, _ in samples]
    normal = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    rhs = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(3)]
    solved = solve(normal, rhs)  # the router's own: the normal equations are SPD
    if solved is None:
        raise ValueError("the decode samples do not separate batch from KV")
    fixed, per_request, per_kv = solved
    return DecodeStep(fixed, per_request, per_kv)


def predict(
    run_: Mapping[str, Any], basis: Mapping[str, float], step: DecodeStep, policy: str
) -> dict[str, float]:
    """One benchmark run replayed under `policy` on the CPU profile of `basis` and `step`."""
    topo, load_ = topology(run_["regime"])
    profile = cpu_engines(basis["p_linear_s"], basis["p_quadratic_s"], step)
    convs = iter(conversations(run_["records"]))
    summary = run(profile, topo, Settings(policy), convs, load_).summary
    return {figure: float(summary[key]) for figure, key in FIGURES}


def fit_runs(res: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The runs D's decode step is measured on (`FIT_ON`)."""
    regime, mode = FIT_ON
    return [r for r in res["runs"] if r["regime"] == regime + EQUAL and r["mode"] == mode]


def table(res: Mapping[str, Any], step: DecodeStep | None = None) -> list[Row]:
    """Every current equal-engine regime's peer modes: measured and predicted medians, with
    D's step measured on `FIT_ON` unless given."""
    step = step if step is not None else decode_step(fit_runs(res))
    rows = []
    regimes = sorted({r["regime"] for r in res["runs"] if r["regime"].endswith(EQUAL)})
    for regime in regimes:
        runs = [r for r in res["runs"] if r["regime"] == regime]
        basis = slo.regime_basis(runs)
        if basis is None:
            continue
        for mode, policy in POLICIES.items():
            mine = [r for r in runs if r["mode"] == mode and r.get("records")]
            if not mine:
                continue
            got = [measured(r["summary"]) for r in mine]
            sim = [predict(r, basis, step, policy) for r in mine]
            name = regime.removesuffix(EQUAL)
            fitted = (name, mode) == FIT_ON
            rows.append(Row(name, mode, len(mine), _median(got), _median(sim), fitted))
    return rows


def _median(values: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {f: statistics.median(v[f] for v in values) for f, _ in FIGURES}


def share_within(rows: Sequence[Row]) -> dict[str, tuple[int, int]]:
    """Per figure: how many predicted rows are within the tolerance, of how many (the row D's
    step was measured on is left out)."""
    held_out = [r for r in rows if not r.fitted]
    return {f: (sum(r.within(f) for r in held_out), len(held_out)) for f, _ in FIGURES}


def markdown(rows: Sequence[Row]) -> str:
    """Predicted / measured per figure (bold: within 25 %), then the count per figure."""
    head = "| regime | policy | runs | " + " | ".join(f for f, _ in FIGURES) + " |"
    lines = [head, "|" + "---|" * (3 + len(FIGURES))]
    for r in rows:
        cells = []
        for f, _ in FIGURES:
            cell = f"{r.ratio(f):.2f}x"
            cells.append(f"**{cell}**" if r.within(f) else cell)
        policy = r.mode.removesuffix("@quiet") + (" (D's step measured here)" if r.fitted else "")
        lines.append(f"| {r.regime} | {policy} | {r.runs} | " + " | ".join(cells) + " |")
    counts = share_within(rows)
    lines.append("")
    lines.append(
        "Predicted within 25 %, of the rows D's step was not measured on: "
        + "; ".join(f"{f} {n} of {total}" for f, (n, total) in counts.items())
        + "."
    )
    return "\n".join(lines)
