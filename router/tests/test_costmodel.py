"""The per-turn path choice (pull, recompute, continue) and the online fit of its costs: pure,
table-tested, and fuzzed with hypothesis (never a disallowed path, never a negative or NaN
coefficient, the break-even always within its bounds)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boomerang.router.learning import wls
from boomerang.router.learning.costmodel import (
    DEFAULT_PRIORS,
    Bounds,
    Choice,
    Coefficients,
    CostModel,
    Path,
    Shape,
    break_even,
    continue_limit,
    decide,
    itl_budget,
)

FLOOR = 64
B = Bounds(floor_tokens=FLOOR)
TRUE = Coefficients(
    p_fixed_s=0.03,
    p_compute_s_per_token=1e-4,
    p_pull_fixed_s=0.021,
    p_pull_s_per_token=2e-5,
    d_first_fixed_s=0.005,
    d_first_s_per_token=5e-6,
    d_fixed_s=0.01,
    d_compute_s_per_token=2e-4,
)
"""Synthetic engines: a pull costs 21 ms fixed, so pull pays from 262.5 tokens."""


def coeffs(**changes: float) -> Coefficients:
    return dataclasses.replace(TRUE, **changes)


BUSY = 1000
"""Streams on a holder so busy that no continue over the ITL budget pays (the overrun rule
has tests of its own, below)."""


def shape(reusable: int, suffix: int = 40, holder: bool = False) -> Shape:
    return Shape(reusable + suffix, reusable, holder, d_streams=BUSY)


def allowed(s: Shape, b: Bounds, limit: int, c: Coefficients) -> set[Path]:
    """The rules of the brief, restated independently of the implementation."""
    out = {Path.RECOMPUTE}
    if s.reusable_tokens > 0 and s.reusable_tokens >= max(b.floor_tokens, b.break_even_min_tokens):
        out.add(Path.PULL)
    if s.holder and b.continue_on_decode and 0 < s.suffix_tokens <= limit:
        out.add(Path.CONTINUE)
    elif s.holder and b.continue_on_decode and 0 < s.suffix_tokens <= b.continue_max_suffix_tokens:
        cost = c.costs(s)
        waits_less = min(cost[p] for p in out) - cost[Path.CONTINUE]
        own = c.d_fixed_s + c.d_compute_s_per_token * s.suffix_tokens  # not D's queue
        own -= c.stream_handoff_stall_s  # what D's streams pay for the turn coming from P
        others_wait = s.d_streams * (own - itl_budget(b, s.d_stream_s))
        if waits_less > others_wait:
            out.add(Path.CONTINUE)
    return out


# --- choose(): tables -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("floor", "reusable", "path"),
    [
        (64, 0, Path.RECOMPUTE),
        (64, 63, Path.RECOMPUTE),
        (64, 64, Path.PULL),
        (64, 100_000, Path.PULL),
        (0, 0, Path.RECOMPUTE),  # nothing to pull, whatever the floor
        (0, 1, Path.PULL),
        (1, 1, Path.PULL),
        (4096, 4095, Path.RECOMPUTE),
        (4096, 4096, Path.PULL),
    ],
)
def test_priors_pull_exactly_when_the_engine_would(floor: int, reusable: int, path: Path) -> None:
    for b in (Bounds(floor_tokens=floor), Bounds(floor_tokens=floor, continue_on_decode=False)):
        for holder in (False, b.continue_on_decode is False):
            assert CostModel().choose(shape(reusable, holder=holder), b).path is path


def test_priors_take_continue_only_for_short_suffixes() -> None:
    m = CostModel()
    assert m.continue_limit_tokens(B) == 30  # (50 ms budget - 20 ms fixed) / 1 ms per token
    assert m.choose(shape(4096, 16, holder=True), B).path is Path.CONTINUE
    assert m.choose(shape(4096, 30, holder=True), B).path is Path.CONTINUE
    assert m.choose(shape(4096, 31, holder=True), B).path is Path.PULL
    assert m.choose(shape(64, 32, holder=True), B).path is Path.PULL  # pull is cheaper there


def test_break_even_decides_between_pull_and_recompute() -> None:
    c = coeffs()
    assert break_even(c, B) == pytest.approx(262.5)
    assert decide(c, shape(262), B).path is Path.RECOMPUTE
    assert decide(c, shape(263), B).path is Path.PULL


def test_break_even_min_raises_the_pull_threshold() -> None:
    b = Bounds(floor_tokens=FLOOR, break_even_min_tokens=500)
    free = coeffs(p_pull_fixed_s=0.0)
    assert decide(free, shape(499), b).path is Path.RECOMPUTE
    assert "no pull: 499 beyond P's cache < 500" in decide(free, shape(499), b).reason
    assert decide(free, shape(500), b).path is Path.PULL


def test_break_even_max_forces_pull_over_recompute() -> None:
    dear = coeffs(p_pull_s_per_token=1e-3)  # pulling never pays
    b = Bounds(floor_tokens=FLOOR, break_even_max_tokens=2000)
    assert decide(dear, shape(1999), b).path is Path.RECOMPUTE
    forced = decide(dear, shape(2000), b)
    assert forced.path is Path.PULL and "pull forced" in forced.reason
    assert forced.costs[Path.RECOMPUTE] < forced.costs[Path.PULL]  # reported, not taken
    assert break_even(dear, b) == 2000.0


def test_forced_pull_still_loses_to_continue() -> None:
    b = Bounds(floor_tokens=FLOOR, break_even_max_tokens=100)
    assert decide(TRUE, shape(4096, 8, holder=True), b).path is Path.CONTINUE


def test_ties_go_to_pull_then_recompute() -> None:
    even = coeffs(p_pull_fixed_s=0.0, p_pull_s_per_token=1e-4)  # pull == recompute
    choice = decide(even, shape(1000), B)
    assert choice.costs[Path.PULL] == pytest.approx(choice.costs[Path.RECOMPUTE])
    assert choice.path is Path.PULL
    # recompute == continue, pull not allowed
    s = shape(10, 40, holder=True)
    recompute = TRUE.costs(s)[Path.RECOMPUTE]
    tie = coeffs(d_fixed_s=recompute - 40 * TRUE.d_compute_s_per_token)
    assert decide(tie, s, B).path is Path.RECOMPUTE
    assert decide(coeffs(d_fixed_s=tie.d_fixed_s - 1e-6), s, B).path is Path.CONTINUE


@pytest.mark.parametrize(
    ("bounds", "d_compute", "limit"),
    [
        (Bounds(floor_tokens=0), 1e-3, 50),
        (Bounds(floor_tokens=0, itl_budget_s=0.1), 1e-3, 100),
        (Bounds(floor_tokens=0, continue_max_suffix_tokens=30), 1e-3, 30),
        (Bounds(floor_tokens=0), 1e-5, 1024),  # the hard bound
        (Bounds(floor_tokens=0), 0.0, 1024),
        (Bounds(floor_tokens=0, itl_budget_s=0.0), 1e-3, 0),
        (Bounds(floor_tokens=0, continue_on_decode=False), 1e-5, 0),
    ],
)
def test_continue_limit(bounds: Bounds, d_compute: float, limit: int) -> None:
    c = coeffs(d_compute_s_per_token=d_compute, d_fixed_s=0.0)
    assert continue_limit(c, bounds) == limit
    if limit:
        assert decide(c, shape(4096, limit, holder=True), bounds).path is Path.CONTINUE
    assert decide(c, shape(4096, limit + 1, holder=True), bounds).path is not Path.CONTINUE


@pytest.mark.parametrize(
    ("bounds", "stream_s", "budget"),
    [
        (Bounds(floor_tokens=0), 0.0, 0.05),  # nothing measured: the fallback
        (Bounds(floor_tokens=0), 1.2, 0.12),  # a tenth of a 1.2 s stream
        (Bounds(floor_tokens=0, tpot_tolerance=0.25), 1.2, 0.3),
        (Bounds(floor_tokens=0), 0.004, 0.0004),  # a fast stream leaves almost nothing
        (Bounds(floor_tokens=0, itl_budget_s=0.2), 1.2, 0.2),  # pinned by the operator
        (Bounds(floor_tokens=0, itl_budget_s=0.0), 0.0, 0.0),
    ],
)
def test_the_itl_budget_is_a_share_of_the_holders_stream_time(
    bounds: Bounds, stream_s: float, budget: float
) -> None:
    assert itl_budget(bounds, stream_s) == pytest.approx(budget)


def test_a_holder_with_longer_streams_takes_longer_continues() -> None:
    """(0.1 * 2 s - 20 ms) / 1 ms = 180 tokens on a holder whose streams last 2 s; a 150 ms
    stream leaves a 15 ms budget, less than D's fixed cost: none; the reason names it."""
    c = coeffs(d_compute_s_per_token=1e-3, d_fixed_s=0.02)
    b = Bounds(floor_tokens=0)
    assert continue_limit(c, b, 2.0) == 180
    assert continue_limit(c, b, 0.15) == 0
    long_streams = Shape(4096, 4000, True, d_stream_s=2.0, d_streams=BUSY)
    assert decide(c, long_streams, b).path is Path.CONTINUE
    short = decide(c, dataclasses.replace(long_streams, d_stream_s=0.15), b)
    assert Path.CONTINUE not in short.costs
    assert "limit 0 (15 ms budget)" in short.reason


def test_stream_times_and_tolerances_outside_their_range_are_refused() -> None:
    with pytest.raises(ValueError, match="d_stream_s"):
        Shape(10, 0, True, d_stream_s=math.inf)
    with pytest.raises(ValueError, match="tpot_tolerance"):
        Bounds(floor_tokens=0, tpot_tolerance=0.0)


def test_the_itl_budget_pays_for_ds_fixed_cost_first() -> None:
    """D's co-running streams wait for the whole continue step, fixed part included."""
    b = Bounds(floor_tokens=0, itl_budget_s=0.05)
    assert continue_limit(coeffs(d_compute_s_per_token=1e-3, d_fixed_s=0.03), b) == 20
    assert continue_limit(coeffs(d_compute_s_per_token=1e-3, d_fixed_s=0.06), b) == 0
    assert continue_limit(coeffs(d_compute_s_per_token=0.0, d_fixed_s=0.06), b) == 0


def test_continue_needs_a_holder_the_switch_and_a_suffix() -> None:
    s = shape(4096, 8, holder=True)
    assert decide(TRUE, s, B).path is Path.CONTINUE
    assert decide(TRUE, dataclasses.replace(s, holder=False), B).path is Path.PULL
    off = dataclasses.replace(B, continue_on_decode=False)
    assert decide(TRUE, s, off).path is Path.PULL
    whole = Shape(4096, 4096, True)  # nothing to compute: D cannot sample from its cache
    assert Path.CONTINUE not in decide(TRUE, whole, B).costs


def test_costs_list_the_allowed_paths_and_the_reason_names_the_choice() -> None:
    choice = decide(TRUE, shape(10, holder=False), B)
    assert set(choice.costs) == {Path.RECOMPUTE}
    assert choice.reason.startswith("recompute: ")
    full = decide(TRUE, shape(4096, 8, holder=True), B)
    assert set(full.costs) == set(Path)
    assert full.costs == {p: v for p, v in TRUE.costs(shape(4096, 8, True)).items()}


def test_costs_follow_the_formulas() -> None:
    s = Shape(5000, 4000, True)
    pull = 0.03 + 1e-4 * 1000 + 0.021 + 2e-5 * 4000 + 0.005 + 5e-6 * 5000
    recompute = 0.03 + 1e-4 * 5000 + 0.005 + 5e-6 * 5000
    assert TRUE.costs(s) == pytest.approx(
        {Path.PULL: pull, Path.RECOMPUTE: recompute, Path.CONTINUE: 0.01 + 2e-4 * 1000}
    )


def test_what_the_holder_holds_bounds_a_pull_and_a_continue_alike() -> None:
    """D's blocks are whole: with its events saying it holds 3,968 of 4,000 verified tokens,
    a pull brings 3,968 and P computes the 1,032 after them, as D would on a continue."""
    s = Shape(5000, 4000, True, d_held_tokens=3968)
    pull = 0.03 + 1e-4 * 1032 + 0.021 + 2e-5 * 3968 + 0.005 + 5e-6 * 5000
    assert (s.suffix_tokens, s.pulled_tokens, s.continue_tokens) == (1032, 3968, 1032)
    assert TRUE.costs(s)[Path.PULL] == pytest.approx(pull)
    assert TRUE.costs(s)[Path.CONTINUE] == pytest.approx(0.01 + 2e-4 * 1032)


@pytest.mark.parametrize(("prompt", "reusable"), [(-1, 0), (10, -1), (10, 11)])
def test_impossible_shapes_are_refused(prompt: int, reusable: int) -> None:
    with pytest.raises(ValueError):
        Shape(prompt, reusable, False)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        Bounds(floor_tokens=-1)
    with pytest.raises(ValueError):
        Bounds(floor_tokens=0, itl_budget_s=math.nan)


def test_break_even_is_clamped_to_floor_and_bounds() -> None:
    assert break_even(coeffs(p_pull_fixed_s=0.0), B) == FLOOR
    assert break_even(TRUE, Bounds(floor_tokens=1000)) == 1000
    assert break_even(TRUE, Bounds(floor_tokens=0, break_even_min_tokens=300)) == 300
    assert break_even(TRUE, Bounds(floor_tokens=0, break_even_max_tokens=100)) == 100
    assert CostModel().break_even_tokens(B, suffix_tokens=500) == FLOOR


def test_metrics_name_every_coefficient() -> None:
    metrics = TRUE.as_metrics()
    assert metrics["p_pull_fixed_s"] == 0.021
    assert metrics["d_compute_s_per_token"] == 2e-4
    assert set(metrics) == {f.name for f in dataclasses.fields(TRUE)} - {"observations"}
    assert CostModel().coefficients().as_metrics() == DEFAULT_PRIORS.as_metrics()


# --- learning ---------------------------------------------------------------------------------


def feed(m: CostModel, c: Coefficients, n: int, rng: random.Random, noise: float = 0.05) -> None:
    """n observations of each leg from engines that follow `c`, with log-normal noise."""
    for _ in range(n):
        computed, pulled = rng.randint(1, 8000), rng.choice([0, rng.randint(64, 8000)])
        p = c.p_fixed_s + c.p_compute_s_per_token * computed
        if pulled:
            p += c.p_pull_fixed_s + c.p_pull_s_per_token * pulled
        m.observe_prefill(computed, pulled, p * rng.lognormvariate(0, noise))
        prompt = computed + pulled
        d_first = c.d_first_fixed_s + c.d_first_s_per_token * prompt
        m.observe_decode_first(prompt, d_first * rng.lognormvariate(0, noise))
        suffix = rng.randint(1, 1024)
        d = c.d_fixed_s + c.d_compute_s_per_token * suffix
        m.observe_continue(suffix, d * rng.lognormvariate(0, noise))


def test_learning_converges_to_the_engines_coefficients() -> None:
    m = CostModel()
    feed(m, TRUE, 3000, random.Random(1))
    got = m.coefficients()
    for name, want in TRUE.as_metrics().items():
        tol = 0.06 if name.endswith("per_token") else 0.25
        assert got.as_metrics()[name] == pytest.approx(want, rel=tol), name
    assert got.observations == {
        "prefill": 3000,
        "decode_first": 3000,
        "continue": 3000,
        "stream": 0,
    }
    assert m.break_even_tokens(B) == pytest.approx(262.5, rel=0.15)
    assert m.continue_limit_tokens(B) == pytest.approx(200, rel=0.08)  # (50 - 10) ms / 0.2 ms
    assert m.choose(shape(150), B).path is Path.RECOMPUTE  # below the learned break-even
    assert m.choose(shape(400), B).path is Path.PULL


def test_learning_follows_a_change_of_engines() -> None:
    m, rng = CostModel(half_life=100.0), random.Random(2)
    feed(m, TRUE, 1000, rng)
    slower = coeffs(p_compute_s_per_token=3e-4, d_compute_s_per_token=1e-3)
    feed(m, slower, 1500, rng)
    got = m.coefficients()
    assert got.p_compute_s_per_token == pytest.approx(3e-4, rel=0.08)
    assert got.d_compute_s_per_token == pytest.approx(1e-3, rel=0.08)


def test_a_handful_of_noisy_points_does_not_flip_the_choice() -> None:
    rng = random.Random(3)
    for _ in range(50):
        m = CostModel()
        for _ in range(3):
            computed, pulled = rng.randint(1, 4000), rng.choice([0, rng.randint(64, 4000)])
            prior = DEFAULT_PRIORS.costs(Shape(computed + pulled, pulled, False))
            p = prior[Path.PULL if pulled else Path.RECOMPUTE] - 0.01 - 2e-5 * (computed + pulled)
            m.observe_prefill(computed, pulled, p * rng.uniform(0.5, 2.0))
        for r in (FLOOR, 128, 256, 1024, 8192):
            assert m.choose(shape(r), B).path is Path.PULL


def test_one_shape_only_keeps_the_fit_well_posed() -> None:
    m = CostModel()
    for _ in range(2000):
        m.observe_prefill(40, 4096, 0.5)
    c = m.coefficients()
    predicted = c.p_fixed_s + 40 * c.p_compute_s_per_token + c.p_pull_fixed_s
    assert predicted + 4096 * c.p_pull_s_per_token == pytest.approx(0.5, rel=0.01)
    assert all(math.isfinite(v) and v >= 0 for v in c.as_metrics().values())


@pytest.mark.parametrize(
    "bad",
    [(-1, 0, 0.1), (10, -5, 0.1), (10, 0, -0.1), (10, 0, math.nan), (10, 0, math.inf), (1, 0, 4e3)],
)
def test_bad_observations_are_ignored(bad: tuple[int, int, float]) -> None:
    m = CostModel()
    m.observe_prefill(*bad)
    m.observe_decode_first(min(bad[0], bad[1]), bad[2])
    m.observe_continue(min(bad[0], bad[1]), bad[2])
    if min(bad[0], bad[1]) >= 0:  # only the seconds are bad: both other legs must ignore them
        assert m.coefficients().observations["continue"] == 0
    assert m.coefficients() == dataclasses.replace(
        DEFAULT_PRIORS, observations={"prefill": 0, "decode_first": 0, "continue": 0, "stream": 0}
    )


def test_observed_costs_can_reach_zero_but_never_below() -> None:
    m = CostModel()
    for i in range(500):
        m.observe_continue(i % 1000 + 1, 0.0)  # instant: the fit wants zero, not negative
    c = m.coefficients()
    assert c.d_fixed_s >= 0 and c.d_compute_s_per_token >= 0
    assert c.d_compute_s_per_token < DEFAULT_PRIORS.d_compute_s_per_token / 50


def test_bad_priors_are_refused() -> None:
    with pytest.raises(ValueError):
        CostModel(coeffs(p_fixed_s=-1.0))
    with pytest.raises(ValueError):
        CostModel(half_life=0.0)


# --- properties -------------------------------------------------------------------------------

tokens = st.integers(min_value=0, max_value=200_000)
seconds = st.one_of(
    st.floats(min_value=0, max_value=100, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e-300, 1e300]),
)
bounds = st.builds(
    Bounds,
    floor_tokens=st.integers(0, 10_000),
    break_even_min_tokens=st.integers(0, 10_000),
    break_even_max_tokens=st.integers(0, 1_000_000),
    continue_on_decode=st.booleans(),
    continue_max_suffix_tokens=st.integers(0, 4096),
    itl_budget_s=st.floats(0, 1, allow_nan=False),
)
shapes = st.builds(
    lambda prompt, frac, holder, streams, stream_s: Shape(
        prompt, int(prompt * frac), holder, d_streams=streams, d_stream_s=stream_s
    ),
    tokens,
    st.floats(0, 1),
    st.booleans(),
    st.integers(0, 64),
    st.floats(0, 30),
)
observations = st.lists(
    st.tuples(st.sampled_from(["prefill", "first", "continue", "stream"]), tokens, tokens, seconds),
    max_size=25,
)


def trained(obs: list[tuple[str, int, int, float]]) -> CostModel:
    m = CostModel(half_life=20.0)
    for leg, a, b, s in obs:
        if leg == "prefill":
            m.observe_prefill(a, b if b % 2 else 0, s)
        elif leg == "first":
            m.observe_decode_first(a, s)
        elif leg == "stream":
            m.observe_stream(a, b % 7, (a + b) % 5, (a % 9) / 2, s)
        else:
            m.observe_continue(a, s)
    return m


@settings(max_examples=150, deadline=None)
@given(obs=observations, s=shapes, b=bounds)
def test_any_observations_keep_the_model_sane(
    obs: list[tuple[str, int, int, float]], s: Shape, b: Bounds
) -> None:
    m = trained(obs)
    c = m.coefficients()
    assert all(math.isfinite(v) and v >= 0 for v in c.as_metrics().values())
    limit = m.continue_limit_tokens(b)
    assert 0 <= limit <= b.continue_max_suffix_tokens
    choice: Choice = m.choose(s, b)
    permitted = allowed(s, b, limit, c)
    assert choice.path in permitted
    assert set(choice.costs) == permitted
    assert all(math.isfinite(v) and v >= 0 for v in choice.costs.values())
    lo = max(b.floor_tokens, b.break_even_min_tokens)
    be = m.break_even_tokens(b)
    assert lo <= be <= max(lo, b.break_even_max_tokens)


@settings(max_examples=200, deadline=None)
@given(obs=observations, s=shapes, b=bounds)
def test_without_continue_pull_is_taken_exactly_from_the_break_even(
    obs: list[tuple[str, int, int, float]], s: Shape, b: Bounds
) -> None:
    m = trained(obs)
    s = dataclasses.replace(s, holder=False)
    be = m.break_even_tokens(b)
    r = s.reusable_tokens
    gap = m.coefficients().costs(s)
    if abs(gap[Path.PULL] - gap[Path.RECOMPUTE]) < 1e-6 and r < b.break_even_max_tokens:
        return  # at the break-even itself rounding decides
    assert (m.choose(s, b).path is Path.PULL) == (r > 0 and r >= be)


# --- the loop: choose, run, observe -----------------------------------------------------------


def serve(m: CostModel, s: Shape, engines: Coefficients, rng: random.Random) -> Path:
    """One turn: the model chooses, the synthetic engines take that long, the model observes."""
    path = m.choose(s, B).path
    noisy = {p: v * rng.lognormvariate(0, 0.05) for p, v in engines.costs(s).items()}
    d_first = engines.d_first_fixed_s + engines.d_first_s_per_token * s.prompt_tokens
    if path is Path.CONTINUE:
        m.observe_continue(s.suffix_tokens, noisy[path])
    else:
        pulled = s.reusable_tokens if path is Path.PULL else 0
        m.observe_prefill(s.prompt_tokens - pulled, pulled, noisy[path] - d_first)
        m.observe_decode_first(s.prompt_tokens, d_first * rng.lognormvariate(0, 0.05))
    return path


def test_the_loop_learns_the_cheapest_path_without_exploring() -> None:
    """From the priors, serving the chosen path alone (first turns recompute: no history)
    teaches the model enough to choose like an oracle that knows the engines."""
    rng, m = random.Random(4), CostModel()
    for _ in range(3000):
        history = rng.choice([0, rng.randint(16, 8000)])
        suffix = rng.choice([rng.randint(1, 64), rng.randint(1, 2000)])
        serve(m, Shape(history + suffix, history, history > 0), TRUE, rng)
    agree = 0
    for _ in range(1000):
        history, suffix = rng.randint(16, 8000), rng.randint(1, 2000)
        s = Shape(history + suffix, history, True)
        oracle = decide(TRUE, s, B)
        agree += m.choose(s, B).path is oracle.path
    assert agree >= 950


# --- the fit (wls.py) -------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.floats(-10, 10, allow_nan=False), min_size=4, max_size=4),
        min_size=4,
        max_size=12,
    ),
    v=st.lists(st.floats(-100, 100, allow_nan=False), min_size=4, max_size=4),
)
def test_the_nonnegative_solution_is_the_best_feasible_point(
    rows: list[list[float]], v: list[float]
) -> None:
    """Against brute force: the KKT point found is the feasible point of least objective."""
    m = [
        [sum(r[i] * r[j] for r in rows) + (1.0 if i == j else 0.0) for j in range(4)]
        for i in range(4)
    ]
    theta, free = wls.nonnegative_solve(m, v)
    for first in itertools.chain.from_iterable(
        itertools.combinations(range(4), k) for k in range(1, 5)
    ):  # wherever the search starts, it ends at the one optimum
        assert wls.nonnegative_solve(m, v, first)[0] == pytest.approx(theta, abs=1e-6)
    if free is not None:
        assert all(theta[i] == 0 for i in range(4) if i not in free)

    def objective(t: list[float]) -> float:
        return sum(t[i] * m[i][j] * t[j] for i in range(4) for j in range(4)) - 2 * sum(
            a * b for a, b in zip(v, t, strict=True)
        )

    assert min(theta) >= 0
    for k in range(5):
        for free in itertools.combinations(range(4), k):
            x = (
                wls.solve([[m[i][j] for j in free] for i in free], [v[i] for i in free])
                if k
                else []
            )
            if x is None or (x and min(x) < 0):
                continue
            t = [0.0] * 4
            for i, xi in zip(free, x, strict=True):
                t[i] = xi
            assert objective(theta) <= objective(t) + 1e-6 * (1 + abs(objective(t)))


def _shapes(rng: random.Random, n: int) -> list[tuple[list[float], float]]:
    """P-leg shaped points (fixed, computed, pulled?, pulled; thousands of tokens) with noise."""
    out = []
    for _ in range(n):
        computed, pulled = rng.uniform(0.01, 4.0), rng.choice([0.0, rng.uniform(0.1, 8.0)])
        x = [1.0, computed, float(pulled > 0), pulled]
        y = 0.01 + 0.2 * computed + 0.005 * (pulled > 0) + 0.02 * pulled
        out.append((x, y * rng.uniform(0.9, 1.1)))
    return out


def test_the_fit_keeps_its_normal_equations_exactly() -> None:
    """Updated in place, observation by observation, past the prior's floor, the system solved
    is the one summed from scratch: every point decayed by its age, plus the prior's weight."""
    prior, points = [0.02, 0.1, 0.0, 0.01], [[1.0, c, 1.0, 1.0] for c in (0.1, 1.0, 4.0)]
    opts = {"half_life": 10.0, "prior_weight": 5.0, "prior_floor": 0.05}
    fit = wls.ForgettingFit(prior, points, **opts)
    unit = wls.ForgettingFit(prior, points, half_life=10.0, prior_weight=1.0, prior_floor=1.0)
    seen: list[tuple[list[float], float, float]] = []
    for x, y in _shapes(random.Random(7), 120):
        predicted = sum(a * b for a, b in zip(x, fit.theta, strict=True))  # a read: solved
        seen.append((x, y, 1.0 / max(1e-3, predicted) ** 2))
        fit.add(x, y)
    d = 0.5 ** (1 / 10.0)
    prior_w = max(0.05, 5.0 * d ** len(seen))
    assert prior_w == 0.05  # the floor was reached
    m = [[prior_w * a for a in row] for row in unit._m]  # unfed: the prior at weight 1
    v = [prior_w * b for b in unit._v]
    for age, (x, y, w) in enumerate(reversed(seen)):
        for i in range(4):
            v[i] += d**age * w * x[i] * y
            for j in range(4):
                m[i][j] += d**age * w * x[i] * x[j]
    assert fit.theta == pytest.approx(wls.nonnegative_solve(m, v)[0], rel=1e-9, abs=1e-12)


def test_solving_now_and_then_learns_what_solving_every_time_does() -> None:
    """Unread, the fit solves every SOLVE_EVERY observations and weights new points by the last
    solution's prediction; read after every point, it solves every time. Both end at the same
    coefficients, within a fraction of a percent."""
    prior, points = [0.05, 0.05, 0.0, 0.05], [[1.0, c, 1.0, c] for c in (0.1, 1.0, 4.0)]
    opts = {"half_life": 200.0, "prior_weight": 20.0, "prior_floor": 1.0}
    lazy, eager = wls.ForgettingFit(prior, points, **opts), wls.ForgettingFit(prior, points, **opts)
    for x, y in _shapes(random.Random(3), 2000):
        lazy.add(x, y)
        eager.add(x, y)
        assert eager.theta is not None  # read: solved now
    assert lazy.count == eager.count == 2000
    assert lazy.theta == pytest.approx(eager.theta, rel=5e-3, abs=1e-4)
    assert eager.theta == pytest.approx([0.01, 0.2, 0.005, 0.02], rel=0.1, abs=2e-3)


def test_a_fit_without_data_is_its_prior_and_forgets_old_data() -> None:
    fit = wls.ForgettingFit(
        [1.0, 2.0], [[1.0, 0.0], [1.0, 1.0]], half_life=10.0, prior_weight=5.0, prior_floor=1e-4
    )
    assert fit.theta == [1.0, 2.0] and fit.count == 0
    for i in range(200):
        fit.add([1.0, float(i % 3)], 3.0 + 1.0 * (i % 3))
    assert fit.theta == pytest.approx([3.0, 1.0], rel=1e-3)
    for i in range(200):
        fit.add([1.0, float(i % 3)], 1.0 + 4.0 * (i % 3))
    assert fit.theta == pytest.approx([1.0, 4.0], rel=1e-3)


# -- load: the queues a turn waits behind (issue 36) -------------------------------------------


@pytest.mark.parametrize(
    ("queued", "path"),
    [
        # 100 tokens on D: its own prefill 10 + 0.2 * 100 = 30 ms, within the 50 ms budget
        (0, Path.CONTINUE),  # 30 ms on D against a pull's 89 ms
        (150, Path.CONTINUE),  # waits 60 ms behind the queue: still the cheapest
        (400, Path.PULL),  # waits 110 ms behind the queue: P is sooner
    ],
)
def test_ds_queue_is_the_continued_turns_wait_not_its_streams_cost(queued: int, path: Path) -> None:
    """The queued prefills stall D's streams whichever path the turn takes, so a continue whose
    own prefill is within the ITL budget stays allowed behind any queue; the queue decides by
    the turn's own wait (measured: gating on the queue cost the follow-up p99 and bought no
    TPOT, module docs)."""
    s = Shape(1000, 900, True, d_queue_tokens=queued, d_streams=BUSY)
    choice = decide(TRUE, s, B)
    assert Path.CONTINUE in choice.costs
    assert choice.costs[Path.CONTINUE] == pytest.approx(0.01 + 0.2e-3 * (100 + queued))
    assert choice.path is path


def test_a_continue_whose_own_prefill_overruns_the_budget_is_refused_on_a_busy_decoder() -> None:
    """limit at TRUE: (50 ms - 10 ms) / 0.2 ms = 200 tokens: 250 on D is over it, queue or
    none, and the busy holder's streams outweigh what the turn would save."""
    for queued in (0, 150):
        choice = decide(TRUE, Shape(1000, 750, True, d_queue_tokens=queued, d_streams=BUSY), B)
        assert Path.CONTINUE not in choice.costs
        assert "no continue: 250 to compute on D, limit 200 (50 ms budget)" in choice.reason


@pytest.mark.parametrize(
    ("streams", "p_queue", "path"),
    [
        # 400 tokens on D: 10 + 0.2 * 400 = 90 ms, 40 over the 50 ms budget; a pull 198 ms
        (0, 0, Path.CONTINUE),  # saves 108 ms and stalls nobody
        (4, 0, Path.PULL),  # 4 streams wait 40 ms more each: 160 ms, more than it saves
        (8, 5000, Path.CONTINUE),  # P busy (0.5 s more for its legs): saves 608, costs 320 ms
        (16, 5000, Path.PULL),  # 640 ms for the streams: more than the turn saves
    ],
)
def test_over_the_budget_a_continue_runs_only_where_it_pays_in_everyones_waiting(
    streams: int, p_queue: int, path: Path
) -> None:
    """The first follow-ups of a burst: each continue queues behind the others on D and is
    over the ITL budget, while P is busy with first turns."""
    s = Shape(4400, 4000, True, p_queue_tokens=p_queue, d_streams=streams)
    choice = decide(TRUE, s, B)
    assert choice.path is path
    assert continue_limit(TRUE, B) == 200  # within the budget alone it would be refused
    if Path.CONTINUE in choice.costs:
        assert "continue over the 50 ms budget" in choice.reason


def test_no_overrun_goes_past_the_hard_bound() -> None:
    b = Bounds(floor_tokens=FLOOR, continue_max_suffix_tokens=300)
    s = Shape(4400, 4000, True, p_queue_tokens=50_000, d_streams=0)
    assert Path.CONTINUE not in decide(TRUE, s, b).costs


def test_streams_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="d_streams"):
        Shape(10, 0, True, d_streams=-1)


def test_ps_queue_is_waited_for_by_both_p_legs_alike() -> None:
    s0 = Shape(4000, 3000, False)
    s1 = dataclasses.replace(s0, p_queue_tokens=20_000)
    c0, c1 = TRUE.costs(s0), TRUE.costs(s1)
    wait = TRUE.p_compute_s_per_token * 20_000
    assert c1[Path.PULL] == pytest.approx(c0[Path.PULL] + wait)
    assert c1[Path.RECOMPUTE] == pytest.approx(c0[Path.RECOMPUTE] + wait)
    assert c1[Path.CONTINUE] == pytest.approx(c0[Path.CONTINUE])


def test_a_busy_p_sends_a_suffix_the_holder_may_take_to_the_holder() -> None:
    """A cheap pull (22 ms) beats a continue of 100 tokens on D (30 ms) until P has 5,000
    tokens queued (0.5 s more for both of P's legs)."""
    cheap_pull = coeffs(
        p_fixed_s=0.005, p_pull_fixed_s=0.0, p_pull_s_per_token=1e-6,
        d_first_fixed_s=0.001, d_first_s_per_token=1e-6,
    )  # fmt: skip
    quiet = Shape(3000, 2900, True, p_cached_tokens=0)
    assert decide(cheap_pull, quiet, B).path is Path.PULL
    queued = dataclasses.replace(quiet, p_queue_tokens=5000)
    assert decide(cheap_pull, queued, B).path is Path.CONTINUE


def test_queues_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="queues"):
        Shape(10, 0, False, p_queue_tokens=-1)


def test_ps_observations_count_the_work_queued_before_them() -> None:
    """P answers after the work sent before it: fed (queued + computed) / throughput, the fit
    finds the throughput, not a per-token time that grows with the load."""
    model = CostModel()
    rng = random.Random(7)
    for _ in range(400):
        computed, queued = rng.randint(100, 8000), rng.choice([0, 0, 3000, 12_000])
        model.observe_prefill(computed, 0, 0.02 + 1.5e-4 * (computed + queued), queued=queued)
    c = model.coefficients()
    assert c.p_compute_s_per_token == pytest.approx(1.5e-4, rel=0.05)
    assert c.p_fixed_s == pytest.approx(0.02, abs=0.01)


def test_until_continues_are_observed_d_computes_at_ps_measured_rate() -> None:
    """The continue leg's prior is never tested by a continue it forbids: P's measured rate
    stands in for D's until D has its own observations."""
    model = CostModel()
    assert model.coefficients().d_compute_s_per_token == DEFAULT_PRIORS.d_compute_s_per_token
    for n in (500, 1000, 2000, 4000) * 20:
        model.observe_prefill(n, 0, 0.02 + 1.25e-4 * n)
    assert model.coefficients().d_compute_s_per_token == pytest.approx(1.25e-4, rel=0.1)
    assert model.continue_limit_tokens(B) > 200  # was (50 - 20) ms / 1 ms = 30 at the priors
    model.observe_continue(150, 0.02 + 1.25e-4 * 150)  # one continue, as P's rate predicts
    assert model.coefficients().d_compute_s_per_token == pytest.approx(1.25e-4, rel=0.1)
    for n in (100, 200, 400) * 100:  # D turns out slower than P: the fit follows
        model.observe_continue(n, 0.01 + 4e-4 * n)
    assert model.coefficients().d_compute_s_per_token == pytest.approx(4e-4, rel=0.2)


# -- what a continue costs D's streams beyond a handover from P (issue 36) ---------------------


@pytest.mark.parametrize(
    ("handoff_stall", "limit"),
    [
        (0.0, 200),  # (50 ms budget - 10 ms fixed) / 0.2 ms: the model before streams were fitted
        (0.03, 350),  # a handover stalls D's streams 30 ms anyway: 30 ms more room
        (0.5, 1024),  # more than any continue: the hard bound
    ],
)
def test_what_a_handover_from_p_costs_ds_streams_widens_the_continue_limit(
    handoff_stall: float, limit: int
) -> None:
    assert continue_limit(coeffs(stream_handoff_stall_s=handoff_stall), B) == limit


@pytest.mark.parametrize(
    ("handoff_stall", "path"),
    [
        # 400 tokens on D: 90 ms, 40 over the 50 ms budget; 4 streams; a pull 198 ms
        (0.0, Path.PULL),  # 4 streams wait 40 ms more each: 160 ms, more than the 108 it saves
        (0.02, Path.CONTINUE),  # the handover costs them 20 ms anyway: 80 ms < 108 ms
    ],
)
def test_over_the_budget_what_the_handover_costs_the_streams_is_not_counted_twice(
    handoff_stall: float, path: Path
) -> None:
    s = Shape(4400, 4000, True, d_streams=4)
    choice = decide(coeffs(stream_handoff_stall_s=handoff_stall), s, B)
    assert choice.path is path


def test_the_stream_leg_learns_what_each_turn_joining_d_costs_its_streams() -> None:
    """Synthetic decoder shaped like the 2p1d measurement: 10 ms per output token and 2 ms more
    per other request in the batch, 74 ms per continued turn, 65 ms per turn handed over from
    P, 5 % noise."""
    m, rng = CostModel(), random.Random(7)
    for _ in range(1000):  # five half-lives: the prior's weight down at its floor
        n, c, h = rng.randint(32, 96), rng.randint(0, 6), rng.randint(0, 6)
        others = rng.uniform(2, 8)
        step = 0.01 + 0.002 * others
        seconds = (step * (n - 1) + 0.074 * c + 0.065 * h) * rng.lognormvariate(0, 0.05)
        m.observe_stream(n, c, h, others, seconds)
    got = m.coefficients()
    assert got.stream_s_per_token == pytest.approx(0.01, rel=0.15)
    assert got.stream_s_per_token_per_other == pytest.approx(0.002, rel=0.15)
    assert got.stream_continue_stall_s == pytest.approx(0.074, rel=0.15)
    assert got.stream_handoff_stall_s == pytest.approx(0.065, rel=0.15)
    assert got.observations["stream"] == 1000


@pytest.mark.parametrize(
    ("tokens", "continued", "over", "others", "seconds"),
    [
        (1, 0, 0, 0.0, 0.5),
        (0, 1, 1, 0.0, 0.5),
        (40, -1, 0, 0.0, 0.5),
        (40, 0, 0, math.nan, 0.5),
        (40, 0, 0, 1.0, math.nan),
        (40, 0, 0, 1.0, 7200.0),
    ],
)
def test_a_stream_without_intervals_or_with_a_bad_count_is_not_learned(
    tokens: int, continued: int, over: int, others: float, seconds: float
) -> None:
    m = CostModel()
    m.observe_stream(tokens, continued, over, others, seconds)
    assert m.coefficients().observations["stream"] == 0
    assert m.coefficients().stream_handoff_stall_s == DEFAULT_PRIORS.stream_handoff_stall_s
