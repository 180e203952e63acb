"""The simulator's SLO goodput (issue 44 item 3): the production benchmark's definition, with
the idle costs read off the profile (`boomsim.slo`)."""

from __future__ import annotations

import pytest
from boomsim.cluster import Topology
from boomsim.policies import Settings
from boomsim.profiles import h200_qwen3_32b
from boomsim.run import Load, run
from boomsim.slo import IDLE_TPOT_TOKENS, Slo, idle_prefill_s, idle_tpot_s
from boomsim.workload import MULTI_TURN, Shape, stream

from bench.production.slo import GOODPUT_SCALE

GPU = h200_qwen3_32b()


def test_the_idle_costs_are_the_profile_s_own() -> None:
    one_chunk = GPU.request_overhead_s + GPU.step_fixed_s + GPU.prefill_s(2000, 0)
    assert idle_prefill_s(GPU, 2000) == pytest.approx(one_chunk)
    chunked = 10_000 - GPU.token_budget
    two = one_chunk - GPU.prefill_s(2000, 0) + GPU.prefill_s(GPU.token_budget, 0)
    two += GPU.step_fixed_s + GPU.prefill_s(chunked, GPU.token_budget)
    assert idle_prefill_s(GPU, 10_000) == pytest.approx(two)
    assert idle_tpot_s(GPU, 4000) == pytest.approx(GPU.step_fixed_s + GPU.decode_s(1, 4000))


@pytest.mark.parametrize(
    ("ttft", "tpot", "met"),
    [(1.0, 1.0, True), (1.01, 1.0, False), (1.0, 1.01, False), (1.0, None, True)],
)
def test_a_turn_meets_both_bounds_or_misses(ttft: float, tpot: float | None, met: bool) -> None:
    slo = Slo(GPU)
    ttft_bound = GOODPUT_SCALE * idle_prefill_s(GPU, 3000)
    tpot_bound = GOODPUT_SCALE * idle_tpot_s(GPU, IDLE_TPOT_TOKENS)  # one bound, as the bench
    t = None if tpot is None else tpot * tpot_bound
    assert slo.meets(3000, 100, ttft * ttft_bound, t) is met


def test_an_idle_cluster_meets_every_turn_and_a_swamped_one_does_not() -> None:
    """Two closed-loop clients on 1P1D meet the bounds; 64 conversations whose first prompts
    are 20-24k tokens, arriving at once, queue on P far past five idle prefills (their
    follow-ups, whose bound is five idle prefills of the whole history, mostly meet it)."""
    calm = run(GPU, Topology(1, 1), Settings("affinity"), stream(MULTI_TURN, 16, 1), Load(2, 2))
    assert calm.summary["attainment"] == 1.0
    assert calm.summary["goodput"] == pytest.approx(calm.summary["turns_per_s"])
    burst = Load(rate=200.0, seed=1)
    heavy = Shape(first=(20_000, 24_000))
    swamped = run(GPU, Topology(1, 1), Settings("affinity"), stream(heavy, 64, 1), burst)
    assert swamped.summary["attainment"] < 0.8
    assert swamped.summary["goodput"] < swamped.summary["turns_per_s"]
