"""The SLO-aware continue gate (issue 48), pure and table-tested: the bounds derived from what
the model measured, the stall budget per stream, and which turns a decoder may serve alone."""

from __future__ import annotations

import dataclasses

import pytest

from boomerang.router.learning.costmodel import (
    BRAKE,
    FALLBACK_ITL_BUDGET_S,
    SLACK_SHARE,
    Bounds,
    Coefficients,
    CostModel,
    Path,
    Shape,
    Slo,
    decide,
    stall_budget,
    tpot_slo,
    ttft_slo,
)

C = Coefficients(
    p_fixed_s=0.02,
    p_compute_s_per_token=1e-4,  # 10k tokens/s on P
    p_pull_fixed_s=0.02,
    p_pull_s_per_token=2e-5,
    d_first_fixed_s=0.01,
    d_first_s_per_token=1e-5,
    d_fixed_s=0.02,
    d_compute_s_per_token=1e-4,  # as fast on D
    stream_s_per_token=0.02,  # the stream fit's intercept, near its prior: not used
    stream_s_per_token_per_other=0.001,
    idle_tpot_s=0.008,  # the fastest recent stream: an idle decoder, 8 ms a token
)
SLO = Slo()  # scale 5: TPOT bound 40 ms
B = Bounds(floor_tokens=64, continue_max_suffix_tokens=8192, slo=SLO)
TOKENS = 200.0
"""The holder's streams decode 200 tokens."""


def budget() -> float:
    return stall_budget(C, SLO, TOKENS)


def follow_up(suffix: int, *, streams: int = 8, absorbed: float = 0.0, p_queue: float = 0.0):
    history = 4000
    return Shape(
        history + suffix,
        history,
        True,
        d_streams=streams,
        d_absorbed_s=absorbed,
        d_stream_tokens=TOKENS,
        p_queue_tokens=p_queue,
    )


def first_turn(prompt: int, *, streams: int = 8, absorbed: float = 0.0, p_queue: float = 0.0):
    return Shape(
        prompt,
        0,
        True,
        pullable=False,
        d_held_tokens=0,
        d_streams=streams,
        d_absorbed_s=absorbed,
        d_stream_tokens=TOKENS,
        p_queue_tokens=p_queue,
        first_turn=True,
    )


def test_the_bounds_derive_from_the_idle_costs() -> None:
    # TTFT: five idle recomputes of the prompt (P's prefill, D's first step)
    idle = 0.02 + 1e-4 * 1000 + 0.01 + 1e-5 * 1000
    assert ttft_slo(C, SLO, 1000) == pytest.approx(5 * idle)
    assert tpot_slo(C, SLO) == pytest.approx(0.040)
    pinned = Slo(ttft_s=2.0, tpot_s=0.05)
    assert ttft_slo(C, pinned, 1000) == 2.0 and ttft_slo(C, pinned, 50_000) == 2.0
    assert tpot_slo(C, pinned) == 0.05


def test_the_stall_budget_is_half_the_streams_tpot_slack() -> None:
    assert budget() == pytest.approx(SLACK_SHARE * TOKENS * (0.040 - 0.008))  # 3.2 s
    assert budget() == pytest.approx(3.2)
    unmeasured = dataclasses.replace(C, idle_tpot_s=0.0)  # the fit's intercept stands in
    assert tpot_slo(unmeasured, SLO) == pytest.approx(0.1)


def test_an_unmeasured_decoder_gets_the_fallback_budget() -> None:
    assert stall_budget(C, SLO, 0.0) == FALLBACK_ITL_BUDGET_S


@pytest.mark.parametrize(("tpot", "expected"), [(0.02, Path.CONTINUE), (0.033, Path.PULL)])
def test_the_measured_brake_stops_continues_near_the_bound(tpot: float, expected: Path) -> None:
    """The holder's recent streams decode at 20 ms (half the bound) or 33 ms (past 80 %)."""
    assert pytest.approx(0.032) == BRAKE * 0.040
    s = dataclasses.replace(follow_up(500), d_tpot_s=tpot)
    assert decide(C, s, B).path is expected


def test_the_idle_tpot_is_the_fastest_recent_stream() -> None:
    model = CostModel()
    assert model.coefficients().idle_tpot_s == 0.0
    for tokens, seconds in ((101, 2.0), (51, 0.4), (4, 0.001), (101, 1.5)):
        model.observe_stream(tokens, 0, 0, 3.0, seconds)
    assert model.coefficients().idle_tpot_s == pytest.approx(0.008)  # 0.4 s / 50; 4 is short
    assert "idle_tpot_s" in model.coefficients().as_metrics()


@pytest.mark.parametrize(
    ("suffix", "absorbed", "expected"),
    [
        (2000, 0.0, Path.CONTINUE),  # a 2k tool result: 220 ms of stall, seconds of slack
        (2000, budget() - 0.1, Path.PULL),  # the most stalled stream has 100 ms left: no room
        (2000, budget() - 0.3, Path.CONTINUE),  # 300 ms left: room
        (8000, 0.0, Path.CONTINUE),  # 820 ms of stall still fits 3.2 s of slack
        (9000, 0.0, Path.PULL),  # over the hard bound
    ],
)
def test_a_follow_up_continues_while_the_most_stalled_stream_has_room(
    suffix: int, absorbed: float, expected: Path
) -> None:
    """Over the per-turn ITL budget (a tenth of a stream) every one of these continues would
    have gone through P; the SLO gate sums the stalls per stream instead."""
    assert decide(C, follow_up(suffix, absorbed=absorbed), B).path is expected


def test_without_slo_the_per_turn_itl_budget_rules() -> None:
    old = dataclasses.replace(B, slo=None)
    s = dataclasses.replace(follow_up(2000), d_stream_s=1.6)  # budget 160 ms < 220 ms stall
    assert decide(C, s, old).path is Path.PULL
    assert decide(C, s, B).path is Path.CONTINUE


def test_a_continue_that_fits_still_loses_to_a_faster_p() -> None:
    """The gate allows; the cost model chooses: a deep queue on D makes P the faster path."""
    s = dataclasses.replace(follow_up(500), d_queue_tokens=50_000)
    assert decide(C, s, B).path is Path.PULL


@pytest.mark.parametrize(
    ("p_queue", "absorbed", "expected"),
    [
        (0.0, 0.0, Path.RECOMPUTE),  # P meets the bound: the decoder's slack is kept
        (60_000.0, 0.0, Path.CONTINUE),  # 6 s queued on P: past the bound, D serves it alone
        (60_000.0, budget() - 0.2, Path.RECOMPUTE),  # ... unless D's streams lack the room
    ],
)
def test_a_first_turn_takes_a_decoder_only_when_p_would_miss_its_bound(
    p_queue: float, absorbed: float, expected: Path
) -> None:
    s = first_turn(3000, p_queue=p_queue, absorbed=absorbed)
    choice = decide(C, s, B)
    assert choice.path is expected, choice.reason
    assert ("TTFT bound" in choice.reason) == (absorbed == 0.0)


def test_a_first_turn_on_an_idle_decoder_still_needs_p_to_miss() -> None:
    """No stream to stall, but on D the turn saves no work: P serves it while P meets."""
    assert decide(C, first_turn(3000, streams=0), B).path is Path.RECOMPUTE
    assert decide(C, first_turn(3000, streams=0, p_queue=60_000), B).path is Path.CONTINUE


def test_the_slo_is_validated() -> None:
    with pytest.raises(ValueError, match="scale"):
        Slo(scale=0.5)
    with pytest.raises(ValueError, match="bounds"):
        Slo(tpot_s=0.0)
    with pytest.raises(ValueError, match="d_absorbed_s"):
        dataclasses.replace(follow_up(10), d_absorbed_s=-1.0)


def test_a_decoders_ledger_keeps_what_each_live_stream_absorbed() -> None:
    from boomerang.router.engines.endpoints import Endpoint

    d = Endpoint("http://d", "decode")
    assert d.absorbed() == 0.0
    d.stall(0.5)  # before any stream: nobody absorbs it
    old = d.begin()
    d.stall(0.2)
    young = d.begin()  # joins after the first stall: absorbs only what comes next
    d.stall(0.1)
    assert d.absorbed() == pytest.approx(0.3)  # the oldest stream took both
    d.end(old)
    assert d.absorbed() == pytest.approx(0.1)
    d.end(young)
    d.stall(float("nan"))
    assert d.absorbed() == 0.0 and d.stalled_s == pytest.approx(0.8)
    d.streamed(2.0, 100)
    d.streamed(4.0, 300)
    assert d.stream_tokens == pytest.approx(120.0)  # the moving mean, a tenth per stream
