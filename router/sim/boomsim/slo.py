"""SLO goodput of a simulated run, as the production benchmark defines it (pure).

Why the benchmark's definition: the simulator's tables are read beside `docs/benchmarks.md`,
whose headline figure is SLO goodput (`e2e/bench/production/slo.py`): the turns per
second whose TTFT and TPOT are both within `GOODPUT_SCALE` times what the same engines take
idle. The benchmark measures its idle costs on the engines; here they come from the profile,
the same cost formulas the engines run on:
- TTFT bound: `scale` times an idle engine's time for the turn's whole prompt (the per-turn
  overhead, then the prompt in `token_budget` chunks, each a step);
- TPOT bound: `scale` times an idle decoder's step with one short stream (the benchmark
  measures it on a 32-token prompt answered with 65 tokens, `calibrate.measure_tpot`), one
  bound for every turn as there.
"""

from __future__ import annotations

from dataclasses import dataclass

from boomsim.profiles import Profile

from bench.production.slo import GOODPUT_SCALE

IDLE_TPOT_TOKENS = 32 + 64 // 2
"""The context of the benchmark's idle TPOT measure, midway through its answer."""


def idle_prefill_s(p: Profile, prompt: int) -> float:
    """An idle engine's time to the first token of `prompt` tokens, nothing cached."""
    t, done = p.request_overhead_s, 0
    while done < prompt:
        n = min(p.token_budget, prompt - done)
        t += p.step_fixed_s + p.prefill_s(n, done)
        done += n
    return t


def idle_tpot_s(p: Profile, tokens: int) -> float:
    """An idle decoder's time per output token for one stream holding `tokens` of KV."""
    return p.step_fixed_s + p.decode_s(1, tokens)


@dataclass(frozen=True)
class Slo:
    """A run's bounds: `scale` times the profile's idle costs."""

    profile: Profile
    scale: float = GOODPUT_SCALE

    def meets(self, prompt: int, answer: int, ttft_s: float, tpot_s: float | None) -> bool:
        """Whether one turn met both bounds (a one-token answer has no TPOT to miss)."""
        if ttft_s > self.scale * idle_prefill_s(self.profile, prompt):
            return False
        if tpot_s is None or answer <= 1:
            return True
        return tpot_s <= self.scale * idle_tpot_s(self.profile, IDLE_TPOT_TOKENS)
