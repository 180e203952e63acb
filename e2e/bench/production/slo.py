"""SLO goodput and attainment of a production-benchmark run (pure).

Why: a user serving agents does not ask which median is lower but how many turns met their
latency objectives, the field's standard figure (DistServe, Splitwise): a turn counts when its
TTFT and its TPOT are both within bounds, goodput is those turns per second of the run's wall,
attainment their share of the turns the client should have sent (a lost turn misses both).

The bounds come from what the same engines measure in isolation (`calibrate.measure` and
`calibrate.measure_tpot` on every engine set, recorded as a run's `slo_basis`; a regime's modes
share the median over its sets, `regime_basis`), not from another machine's milliseconds:
- TTFT: `scale` times an idle prefill engine's time for the turn's whole prompt (what a turn
  costs with no cache and no queue; a follow-up that reuses its history has that much slack);
- TPOT: `scale` times an idle decoder's time per output token.
One `scale` moves both (DistServe's SLO scale); `GOODPUT_SCALE` is the headline's, the
attainment plot shows every scale of `SCALES`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

GOODPUT_SCALE = 5.0
"""The headline's SLO scale: five times the idle cost leaves room for the queue of eight
clients on one prefill engine and for a batch of eight streams on one decoder, both measured
here at two to four times idle, and still fails a turn that waited behind a long prefill."""
SCALES = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0)


def ttft_slo_s(basis: Mapping[str, float], prompt_tokens: int, scale: float) -> float:
    """The TTFT bound of a turn with `prompt_tokens`: `scale` idle prefills of the prompt."""
    n = prompt_tokens
    return scale * (basis["p_linear_s"] * n + basis["p_quadratic_s"] * n * n)


def tpot_slo_s(basis: Mapping[str, float], scale: float) -> float:
    return scale * basis["d_tpot_s"]


def meets(record: Mapping[str, Any], basis: Mapping[str, float], scale: float) -> bool:
    """Whether one recorded turn met both bounds (a one-token answer has no TPOT to miss)."""
    ttft_ok = bool(record["ttft_ms"] / 1000 <= ttft_slo_s(basis, record["input_num_tokens"], scale))
    if record.get("output_num_tokens", 0) <= 1:
        return ttft_ok
    return ttft_ok and bool(record["tpot_ms"] / 1000 <= tpot_slo_s(basis, scale))


Basis = Mapping[str, float]


def regime_basis(runs: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """One basis for every mode of a regime: each measure's median over the engine sets that
    ran it (the same engines: a set that measured slower must not loosen its own modes'
    bounds); None when no run kept one."""
    sets = {tuple(sorted(b.items())) for r in runs if (b := r.get("slo_basis"))}
    bases = [dict(items) for items in sets]  # one per engine set, however many runs it ran
    if not bases:
        return None
    return {key: median(b[key] for b in bases) for key in bases[0]}


def met(run: Mapping[str, Any], scale: float, basis: Basis | None = None) -> int | None:
    """How many of the run's turns met both bounds (`basis`: the regime's, else the run's
    own); None for a run recorded without one."""
    basis = basis if basis is not None else run.get("slo_basis")
    if not basis or not run.get("slo_basis"):
        return None
    return sum(1 for r in run["records"] if meets(r, basis, scale))


def attainment(run: Mapping[str, Any], scale: float, basis: Basis | None = None) -> float | None:
    """The share of the turns the client should have sent that met both bounds."""
    n = met(run, scale, basis)
    expected = run["summary"].get("expected") if n is not None else None
    return None if n is None or not expected else n / expected


def goodput(
    run: Mapping[str, Any], scale: float = GOODPUT_SCALE, basis: Basis | None = None
) -> float | None:
    """Turns meeting both bounds per second of the run's wall."""
    n = met(run, scale, basis)
    wall = run["summary"].get("wall_s") if n is not None else None
    return None if n is None or not wall else n / wall


def curve(
    runs: Sequence[Mapping[str, Any]], scales: Sequence[float] = SCALES, basis: Basis | None = None
) -> list[float]:
    """A mode's attainment at each scale, the median over its runs (empty: no basis)."""
    out = []
    for scale in scales:
        values = [a for r in runs if (a := attainment(r, scale, basis)) is not None]
        if not values:
            return []
        out.append(median(values))
    return out


def d_alone(run: Mapping[str, Any]) -> float | None:
    """The turns the decoder served without P in a run (the router's `continue` path: a
    decode-first turn, or a turn Boomerang continued on its holder); None without counts."""
    path = (run.get("router") or {}).get("path")
    return float(path.get("continue", 0.0)) if isinstance(path, Mapping) else None
