"""`bench_fit`: the cost model's learning per turn, as `make bench-fit` measures it."""

from __future__ import annotations

from bench_fit import observations, run

from boomerang.router.learning import wls


def test_it_counts_the_solves_and_leaves_the_solver_as_it_was() -> None:
    solver = wls.nonnegative_solve
    seconds, solves, coefficients = run(observations(160))
    assert wls.nonnegative_solve is solver
    assert seconds > 0
    # 320 observations, two fits: one solve per SOLVE_EVERY, plus one for each fit read at the end.
    assert solves == 2 * (160 // wls.SOLVE_EVERY) + (2 if 160 % wls.SOLVE_EVERY else 0)
    assert coefficients.observations["prefill"] == 160
    assert coefficients.p_compute_s_per_token > 0


def test_the_stream_is_seeded_and_turn_shaped() -> None:
    stream = observations(16)
    assert stream == observations(16)
    assert [pulled > 0 for _, pulled, *_ in stream] == [i % 8 != 0 for i in range(16)]
