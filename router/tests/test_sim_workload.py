"""The simulator's workloads keep their documented shapes, and the report draws its plot."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from statistics import fmean, pstdev

import pytest
from boomsim.loop import Loop
from boomsim.plot import pd_ratio
from boomsim.policies import POLICIES
from boomsim.workload import AGENTIC, MULTI_TURN, OpenLoop, Shape, published, stream


def test_the_multi_turn_shape_is_vllms_documented_one_and_seeded() -> None:
    convs = list(stream(MULTI_TURN, 200, seed=3))
    assert convs == list(stream(MULTI_TURN, 200, seed=3))
    assert convs != list(stream(MULTI_TURN, 200, seed=4))
    for turns in convs:
        assert 4 <= len(turns) <= 6
        assert 1500 <= turns[0][0] <= 3000
        for (prev, answer, _), (prompt, _, _) in itertools.pairwise(turns):
            assert 20 <= prompt - prev - answer <= 200  # the user turn, after the answer
        assert all(32 <= a <= 96 for _, a, _ in turns)


def test_agentic_sessions_have_tool_results_and_think_times_within_the_max_length() -> None:
    turns = [t for conv in stream(AGENTIC, 300, seed=1) for t in conv[1:]]
    assert turns and all(1.0 <= think <= 30.0 for _, _, think in turns)
    assert all(p + a <= AGENTIC.max_len for p, a, _ in turns)
    short = list(stream(Shape(first=(30_000, 32_000), turns=(20, 20)), 20, seed=1))
    assert all(len(c) < 20 for c in short)  # cut at the max model length


def test_the_published_sweep_grows_by_a_user_turn_and_an_answer() -> None:
    turns = published(2000)
    assert [p for p, _, _ in turns[:3]] == [2150, 2600, 3050] and len(turns) == 10


def test_the_ratio_plot_is_written(tmp_path: Path) -> None:
    rows = [
        {"ratio": r, "policy": p, "follow_p50": 0.1 * (i + 1), "follow_p99": 0.5}
        for i, r in enumerate(("1P1D", "1P2D"))
        for p in POLICIES
    ]
    out = pd_ratio(rows, tmp_path / "r.png")
    assert out.stat().st_size > 1000


def test_bursty_arrivals_keep_the_rate_and_poisson_stays_as_it_was() -> None:
    """Gamma-distributed gaps with the asked coefficient of variation and the same mean; at a
    CV of 1 the gaps are the exponential ones drawn before (published tables unchanged)."""

    def gaps(cv: float, seed: int = 7) -> list[float]:
        arrivals = OpenLoop(Loop(), lambda *a: None, iter(()), 2.0, random.Random(seed), cv)
        return [arrivals._gap() for _ in range(40_000)]

    bursty = gaps(3.0)
    assert fmean(bursty) == pytest.approx(0.5, rel=0.06)
    assert pstdev(bursty) / fmean(bursty) == pytest.approx(3.0, rel=0.1)
    rng = random.Random(7)
    assert gaps(1.0)[:100] == [rng.expovariate(2.0) for _ in range(100)]
