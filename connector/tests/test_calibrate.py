"""Timeouts sized by the machine's measured prefill, and the line that says what machine it was."""

from __future__ import annotations

import pytest

from boomerang.local import calibrate

from bench.engine.ttft import NEW_TOKENS, plan
from bench.harness import machine


def test_the_fit_passes_through_both_samples_when_cost_per_token_grows() -> None:
    cost = calibrate.fit([(1024, 3.0), (256, 0.5)])
    assert cost.seconds(256) == pytest.approx(0.5)
    assert cost.seconds(1024) == pytest.approx(3.0)
    assert cost.quadratic_s > 0


def test_the_fit_never_falls_below_a_sample_beyond_it() -> None:
    # A steep second sample makes the exact linear term negative: it is clamped at 0, which
    # only raises the curve.
    cost = calibrate.fit([(256, 0.1), (1024, 10.0)])
    assert cost.linear_s == 0.0
    assert cost.seconds(1024) >= 10.0 and cost.seconds(4096) >= 10.0 * 16 * 0.9


def test_noise_that_hides_growth_gives_the_slower_line() -> None:
    cost = calibrate.fit([(256, 1.0), (1024, 2.0)])
    assert cost.quadratic_s == 0.0
    assert cost.seconds(2048) == pytest.approx(2048 / 256)


def test_timeouts_grow_with_a_slow_machine_and_keep_the_floor_on_a_fast_one() -> None:
    fast, slow = calibrate.PrefillCost(1e-5, 0.0), calibrate.PrefillCost(0.05, 1e-6)
    assert calibrate.timeout_for(fast, 16384) == calibrate.FLOOR_S
    slow_t = calibrate.router_timeouts(slow, 4096)
    assert slow_t["prefill_s"] == pytest.approx(calibrate.SAFETY * slow.seconds(4096))
    assert slow_t["decode_first_byte_s"] == slow_t["prefill_s"] < slow_t["decode_total_s"]


def test_the_benchmark_leaves_out_the_histories_that_do_not_fit_and_says_so() -> None:
    cost = calibrate.PrefillCost(0.01, 0.0)  # 100 tokens/s
    kept, notes = plan([4096, 1024, 2048], reps=1, cost=cost, budget_s=6 * 0.01 * 3200)
    assert kept == [1024, 2048]
    assert len(notes) == 1 and notes[0].startswith("left out 4096")
    kept_all, none_left = plan(
        [4096], reps=1, cost=cost, budget_s=6 * cost.seconds(4096 + NEW_TOKENS)
    )
    assert (kept_all, none_left) == ([4096], [])


@pytest.mark.parametrize(
    ("avx512", "bf16", "library"),
    [(True, True, "vllm._C"), (True, False, "vllm._C_AVX512"), (False, False, "vllm._C_AVX2")],
)
def test_the_kernel_set_is_vllms_own_choice(avx512, bf16, library) -> None:
    assert machine.kernel_set(avx512, bf16).endswith(f"({library})")


def test_cpu_info_reads_the_model_and_the_features_that_matter() -> None:
    text = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\n\nmodel name\t: other\n"
    assert machine.cpu_info(text) == ("AMD EPYC", ["avx2"])
