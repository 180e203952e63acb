"""The idle decision: an engine loop waits only while its scheduler holds nothing but finished
requests kept for a later read, and never past the idle period or an input."""

from __future__ import annotations

from dataclasses import replace

import pytest

from boomerang.connector.plugin.idle_policy import (
    DEFAULT_IDLE_STEP_S,
    LoopFacts,
    idle_step_s,
    idle_wait_s,
    retaining_only,
)

RETAINING = LoopFacts(
    requests=3,
    unfinished=0,
    finished_unsent=0,
    push_pending=False,
    other_connector=False,
    batches_in_flight=0,
    engines_running=False,
    may_block=True,
)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, True),
        ({"requests": 0}, False),  # nothing held: vLLM blocks by itself
        ({"unfinished": 1}, False),  # a request running, waiting or pulling its KV
        ({"finished_unsent": 1}, False),  # the workers must still hear it finished
        ({"push_pending": True}, False),
        ({"other_connector": True}, False),
        ({"batches_in_flight": 1}, False),
        ({"engines_running": True}, False),
        ({"may_block": False}, True),  # retaining, but see idle_wait_s
    ],
)
def test_only_finished_requests_kept_for_a_read_count_as_retaining(
    change: dict[str, object], expected: bool
) -> None:
    assert retaining_only(replace(RETAINING, **change)) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "last_step", "last_input", "now", "period", "wait"),
    [
        (RETAINING, 100.0, 50.0, 100.0, 30.0, 30.0),  # just stepped: a whole period
        (RETAINING, 100.0, 50.0, 120.0, 30.0, 10.0),  # what is left of it
        (RETAINING, 100.0, 50.0, 130.0, 30.0, 0.0),  # the idle step is due
        (RETAINING, 100.0, 50.0, 400.0, 30.0, 0.0),  # long overdue: step, never negative
        (RETAINING, 100.0, 100.0, 100.0, 30.0, 0.0),  # an input at the step: step again
        (RETAINING, 100.0, 101.0, 102.0, 30.0, 0.0),  # an input during the step
        (RETAINING, 100.0, 50.0, 100.0, 0.0, 0.0),  # period 0: the hook is off
        (RETAINING, 0.0, 0.0, 5.0, 30.0, 0.0),  # the loop's first pass steps
        (None, 100.0, 50.0, 100.0, 30.0, 0.0),  # facts unreadable: step as vLLM would
        (replace(RETAINING, unfinished=1), 100.0, 50.0, 100.0, 30.0, 0.0),
        (replace(RETAINING, may_block=False), 100.0, 50.0, 100.0, 30.0, 0.0),  # shutting down
    ],
)
def test_the_wait_ends_at_the_idle_step_and_an_input_cancels_it(
    facts: LoopFacts | None,
    last_step: float,
    last_input: float,
    now: float,
    period: float,
    wait: float,
) -> None:
    assert idle_wait_s(facts, last_step, last_input, now, period) == wait


@pytest.mark.parametrize(
    ("env", "period"),
    [
        ({}, DEFAULT_IDLE_STEP_S),
        ({"BOOMERANG_IDLE_STEP_S": ""}, DEFAULT_IDLE_STEP_S),
        ({"BOOMERANG_IDLE_STEP_S": "0"}, 0.0),
        ({"BOOMERANG_IDLE_STEP_S": "2.5"}, 2.5),
    ],
)
def test_the_period_comes_from_the_environment_and_zero_turns_it_off(
    env: dict[str, str], period: float
) -> None:
    assert idle_step_s(env) == period


@pytest.mark.parametrize("raw", ["soon", "-1", "nan", "inf"])
def test_a_bad_period_is_refused_clearly(raw: str) -> None:
    with pytest.raises(ValueError, match="BOOMERANG_IDLE_STEP_S"):
        idle_step_s({"BOOMERANG_IDLE_STEP_S": raw})


def test_the_default_keeps_the_workers_spin_under_five_percent_of_a_core() -> None:
    spin_after_each_step_s = 1.0  # vLLM's shared-memory reader busy-loop window
    assert spin_after_each_step_s / DEFAULT_IDLE_STEP_S < 0.05
