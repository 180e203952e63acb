"""The plan of a verified turn (`plan.py`), table-tested: what each planner tries first, what
it falls back to, and when it lets D's handle go."""

from __future__ import annotations

import pytest

from boomerang.router.learning.costmodel import DEFAULT_PRIORS, Bounds, CostModel, Path
from boomerang.router.turn.plan import Facts, Plan, adaptive_plan, after_failure, static_plan

PULL, RECOMPUTE, CONTINUE = Path.PULL, Path.RECOMPUTE, Path.CONTINUE


def facts(prompt=4000, reusable=3000, p_cached=0, pullable=True, holder=False) -> Facts:
    return Facts(prompt, reusable, pullable, holder, p_cached)


@pytest.mark.parametrize(
    ("f", "floor", "legs"),
    [
        (facts(), 64, (PULL,)),  # nothing on P: pull the history
        (facts(p_cached=2944), 50, (PULL,)),  # 56 beyond P's cache >= 50
        (facts(p_cached=2944), 64, (RECOMPUTE,)),  # 56 < 64: P would recompute them anyway
        (facts(p_cached=3000), 0, (RECOMPUTE,)),  # P holds all of it: nothing to pull
        (facts(p_cached=3500), 64, (RECOMPUTE,)),  # P holds more than D
        (facts(pullable=False), 64, (RECOMPUTE,)),  # released or unclaimed: never to P
        (facts(reusable=0), 0, (RECOMPUTE,)),
    ],
)
def test_static_pulls_what_p_lacks_when_it_reaches_the_floor(f: Facts, floor, legs) -> None:
    plan = static_plan(f, floor)
    assert plan.legs == legs
    assert plan.declines == (legs == (RECOMPUTE,))


def test_static_never_continues() -> None:
    assert static_plan(facts(holder=True, p_cached=3000), 64).legs == (RECOMPUTE,)


def model() -> CostModel:
    return CostModel(DEFAULT_PRIORS)


BOUNDS = Bounds(floor_tokens=64, itl_budget_s=1.0)


@pytest.mark.parametrize(
    ("f", "legs"),
    [
        # a short suffix on the holder: continue, then pull (D alive), then recompute
        (facts(prompt=3050, reusable=3000, holder=True), (CONTINUE, PULL, RECOMPUTE)),
        # the same with P holding everything D has: continue, then recompute
        (facts(prompt=3050, reusable=3000, holder=True, p_cached=3000), (CONTINUE, RECOMPUTE)),
        # no holder: pull over recompute (the priors make pull never dearer)
        (facts(prompt=3050, reusable=3000), (PULL,)),
        # released handle, holder alive: continue, then recompute
        (facts(prompt=3050, reusable=3000, holder=True, pullable=False), (CONTINUE, RECOMPUTE)),
        # a long suffix is over the continue bound: pull
        (facts(prompt=9000, reusable=3000, holder=True), (PULL,)),
    ],
)
def test_adaptive_takes_the_cheapest_leg_and_its_fallbacks(f: Facts, legs) -> None:
    plan = adaptive_plan(f, model(), BOUNDS)
    assert plan.legs == legs, plan.reason
    assert plan.declines == (legs == (RECOMPUTE,))


def test_adaptive_counts_only_what_p_lacks_as_pulled() -> None:
    plan = adaptive_plan(facts(prompt=4000, reusable=3000, p_cached=2990), model(), BOUNDS)
    assert plan.legs == (RECOMPUTE,) and "10 beyond P's cache < 64" in plan.reason


@pytest.mark.parametrize(("answered", "rest"), [(True, (PULL, RECOMPUTE)), (False, (RECOMPUTE,))])
def test_a_failed_continue_pulls_only_from_a_holder_that_answered(answered, rest) -> None:
    plan = Plan((CONTINUE, PULL, RECOMPUTE), "test")
    assert after_failure(plan, CONTINUE, holder_answered=answered) == rest
    assert after_failure(Plan((CONTINUE, RECOMPUTE), "t"), CONTINUE, False) == (RECOMPUTE,)


def test_facts_are_checked() -> None:
    with pytest.raises(ValueError):
        facts(prompt=10, reusable=20)
