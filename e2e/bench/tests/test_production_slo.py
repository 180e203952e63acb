"""SLO goodput and the equal-engine report (`bench.production.slo`, `bench.production.equal`): the
bounds from an idle engine's measures, what a turn must meet, goodput and attainment with lost
turns failing, turns the decoder served alone, the A/A noise band and the best peer per figure."""

from __future__ import annotations

from typing import Any

import pytest

from bench.production import equal, report, slo

BASIS = {"p_linear_s": 0.001, "p_quadratic_s": 0.0, "d_tpot_s": 0.01}
"""An idle P prefilling 1,000 tokens/s, an idle D at 10 ms a token."""


def turn(tokens: int, ttft_ms: float, tpot_ms: float = 20.0, out: int = 40) -> dict[str, Any]:
    return {"input_num_tokens": tokens, "ttft_ms": ttft_ms, "tpot_ms": tpot_ms,
            "output_num_tokens": out, "input_num_turns": 1, "latency_ms": ttft_ms,
            "start_time_ms": 0.0}  # fmt: skip


def a_run(records: list[dict[str, Any]], expected: int, wall: float, path: Any = None) -> Any:
    run: dict[str, Any] = {
        "records": records, "slo_basis": BASIS,
        "summary": {"expected": expected, "answered": len(records), "wall_s": wall},
    }  # fmt: skip
    if path is not None:
        run["router"] = {"path": path}
    return run


def test_the_bounds_scale_an_idle_engines_measures() -> None:
    assert slo.ttft_slo_s(BASIS, 2000, 3.0) == pytest.approx(6.0)
    assert slo.ttft_slo_s({**BASIS, "p_quadratic_s": 1e-7}, 1000, 1.0) == pytest.approx(1.1)
    assert slo.tpot_slo_s(BASIS, 3.0) == pytest.approx(0.03)


@pytest.mark.parametrize(
    ("record", "scale", "ok"),
    [
        (turn(1000, 2000, 20), 2.0, True),  # at both bounds
        (turn(1000, 2001, 20), 2.0, False),  # TTFT over
        (turn(1000, 500, 21), 2.0, False),  # TPOT over
        (turn(1000, 500, 500, out=1), 2.0, True),  # one token: no TPOT to miss
        (turn(4000, 5000, 20), 2.0, True),  # a long prompt has a longer TTFT bound
    ],
)
def test_a_turn_meets_both_bounds_or_none(record: Any, scale: float, ok: bool) -> None:
    assert slo.meets(record, BASIS, scale) is ok


def test_goodput_counts_meeting_turns_and_a_lost_turn_fails() -> None:
    run = a_run([turn(1000, 500), turn(1000, 500), turn(1000, 9000)], expected=4, wall=10.0)
    assert slo.met(run, 2.0) == 2
    assert slo.goodput(run, 2.0) == pytest.approx(0.2)
    assert slo.attainment(run, 2.0) == pytest.approx(0.5)  # of 4 expected: the lost one fails
    assert slo.curve([run], (1.0, 2.0, 10.0)) == [0.0, 0.5, 0.75]  # 20 ms TPOT > 1x 10 ms
    assert slo.goodput({**run, "slo_basis": None}) is None  # no basis: no figure, not 0


def test_turns_on_the_decoder_alone_come_from_the_routers_path_counts() -> None:
    assert slo.d_alone(a_run([], 1, 1.0, path={"continue": 3.0, "recompute": 5.0})) == 3.0
    assert slo.d_alone(a_run([], 1, 1.0)) is None


def summary(follow: float, tpot: float, wall: float) -> dict[str, Any]:
    spread = lambda v: {"p50": v, "p90": v, "p99": v}  # noqa: E731
    return {"followup_ttft_s": spread(follow), "first_ttft_s": spread(1.0),
            "tpot_s": spread(tpot), "wall_s": wall, "lost": 0, "stalled": 0,
            "expected": 2, "answered": 2}  # fmt: skip


def mode(follow: float, tpot: float, good_ttft_ms: float, alone: float = 0.0) -> Any:
    run = a_run([turn(1000, good_ttft_ms), turn(1000, 500)], 2, 10.0, {"continue": alone})
    run["summary"] = summary(follow, tpot, 10.0)
    return report.pooled([run])


def test_the_equal_headline_takes_the_best_peer_per_figure_and_reads_ties() -> None:
    modes = {
        "decode-first-2048@quiet": mode(0.2, 0.03, 9000, alone=5),  # best follow-up, 1 in SLO
        "affinity@quiet": mode(0.4, 0.02, 500),  # best TPOT, both turns in SLO
        "adaptive": mode(0.1, 0.021, 500, alone=1),
        "adaptive-aa": mode(0.102, 0.0205, 500),  # the twin: 2 % and ~2.4 % off
    }
    peers = ["decode-first-2048@quiet", "affinity@quiet"]
    band = equal.noise(modes, "adaptive", "adaptive-aa")
    assert band["follow-up TTFT p50"] == pytest.approx(0.02)
    line = equal.headline({"agentic": modes}, "adaptive", peers, "adaptive-aa")
    assert line is not None
    # Goodput ties the best peer (affinity, 0.2 turns/s): under agentic's 1.5x, so bold.
    assert "**1.00x vs affinity@quiet (tie)**" in line
    assert "0.50x vs decode-first-2048@quiet |" in line  # follow-up p50, target 0.5 there: met
    assert "1.05x vs affinity@quiet" in line and "**1.05x" not in line  # TPOT p50, 1.05: met
    table = equal.slo_table("agentic", modes, "adaptive-aa", "adaptive")
    assert "| affinity@quiet | 1 | 0.200 (0.200-0.200) | 100% (100%-100%) | 0 (0%) |" in table
    assert "| decode-first-2048@quiet | 1 | 0.100" in table and "5 (250%)" in table
    assert "A/A (adaptive-aa against adaptive" in table


def test_a_decode_first_rule_that_sent_no_turn_to_the_decoder_never_fired() -> None:
    assert equal.fired("decode-first-512@quiet", {"d_alone_total": 0.0, "d_alone_share": 0.0})
    assert "never fired" in equal.fired("dynamo@quiet", {"d_alone_total": 0.0})
    assert "never fired" not in equal.fired("affinity@quiet", {"d_alone_total": 0.0})
    assert "never fired" not in equal.fired("dynamo@quiet", {"d_alone_total": 2.0})


def test_no_peer_ran_no_equal_headline() -> None:
    modes = {"adaptive": mode(0.1, 0.02, 500)}
    assert equal.headline({"spare": modes}, "adaptive", ["affinity@quiet"], "adaptive-aa") is None
    assert report.equal_blocks({"pooled": {"spare": modes}, "default_mode": "adaptive"}) == []


def test_the_readme_leads_with_equal_engines_and_says_the_engine_fix_in_a_line() -> None:
    modes = {
        "affinity": mode(0.8, 0.04, 9000),  # stock: twice as slow as on Boomerang's engines
        "affinity@quiet": mode(0.4, 0.02, 500),
        "adaptive": mode(0.2, 0.02, 500),
        "adaptive-aa": mode(0.2, 0.02, 500),
    }
    res = {
        "pooled": {"agentic": modes}, "default_mode": "adaptive", "client": "vLLM x",
        "peers": ["affinity@quiet"], "twin": "adaptive-aa", "rounds": 1,
    }  # fmt: skip
    assert report.engine_fix(res, "follow-up TTFT p50") == (0.5, 0.5)
    block = report.readme_block(res)
    assert block.index("| agentic |") < block.index("engine fix")
    assert "0.50x vs affinity@quiet" in block  # the follow-up p50 against the peer
    assert "0.50-0.50x on follow-up TTFT p50" in block
    assert "production_slo.png" in block
    assert report.equal_readme_block({**res, "peers": []}) is None


def test_a_regimes_modes_share_one_basis_the_median_of_its_sets() -> None:
    """A set that measured its engines slower must not loosen its own modes' bounds."""
    slow = {"p_linear_s": 0.004, "p_quadratic_s": 0.0, "d_tpot_s": 0.04}
    runs = [a_run([turn(1000, 6000)], 1, 10.0) for _ in range(3)]
    runs[2]["slo_basis"] = slow  # mode c's set measured four times slower
    middle = {"p_linear_s": 0.002, "p_quadratic_s": 0.0, "d_tpot_s": 0.02}
    assert slo.regime_basis([*runs, a_run([], 1, 1.0) | {"slo_basis": middle}]) == middle
    runs[1]["slo_basis"] = dict(BASIS)  # the same set measured once, however many runs
    assert slo.regime_basis(runs) == {k: (BASIS[k] + slow[k]) / 2 for k in BASIS}
    runs[1]["slo_basis"] = {**BASIS, "d_tpot_s": 0.011}  # a second fast set
    assert slo.regime_basis(runs) == {**BASIS, "d_tpot_s": 0.011}  # the median of three
    assert slo.met(runs[2], 5.0) == 1  # 6 s is within 5 of its own slow prefills (20 s)
    assert slo.met(runs[2], 5.0, BASIS) == 0  # not within 5 of the regime's (5 s)
    assert slo.regime_basis([{"records": []}]) is None
    for run, name in zip(runs, "abc", strict=True):
        run.update(regime="r", mode=name, summary={**summary(1, 0.02, 10.0), "expected": 1})
    pooled = report.pooled_by_regime(runs)["r"]
    assert [pooled[m]["attainment"]["median"] for m in "abc"] == [0, 0, 0]


def test_a_best_peer_that_never_fired_is_named_for_what_it_ran_as() -> None:
    modes = {
        "decode-first-512@quiet": mode(0.4, 0.01, 500),  # the best TPOT, no turn on D alone
        "adaptive": mode(0.2, 0.02, 500, alone=1),
        "adaptive-aa": mode(0.2, 0.02, 500),
    }
    line = equal.headline({"agentic": modes}, "adaptive", ["decode-first-512@quiet"], "adaptive-aa")
    assert line is not None
    assert "2.00x vs decode-first-512@quiet (never fired: affinity in effect)" in line


def test_the_headline_says_how_many_follow_ups_a_p99_is_of_and_leaves_old_routers_out() -> None:
    """A follow-up p99 over 51 follow-ups is about the worst one: the README says so; an
    equal sitting kept under a label naming its router is history, not a headline row."""
    modes = {"affinity@quiet": mode(0.4, 0.02, 500), "adaptive": mode(0.2, 0.02, 500),
             "adaptive-aa": mode(0.2, 0.02, 500)}  # fmt: skip
    records = [{"conversation_id": f"c{i % 3}", "input_num_turns": 1 + 2 * (i >= 3)}
               for i in range(8)]  # fmt: skip
    res = {
        "pooled": {"agentic": modes, "agentic, router 6984497": modes},
        "runs": [{"regime": "agentic", "mode": "adaptive", "records": records}],
        "default_mode": "adaptive", "client": "vLLM x", "peers": ["affinity@quiet"],
        "twin": "adaptive-aa", "rounds": 1,
    }  # fmt: skip
    assert list(report.equal_regimes(res)) == ["agentic"]
    block = report.readme_block(res)
    assert "| agentic, router 6984497 |" not in block
    assert "3 conversations and 5 follow-ups a run (agentic)" in block
