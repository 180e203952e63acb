"""The simulated router decides as the router does: plan.py's planners on the same facts."""

from __future__ import annotations

from typing import Any

import pytest
from boomsim import policies
from boomsim.cluster import Topology
from boomsim.policies import POLICIES, Settings
from boomsim.profiles import h200_qwen3_32b
from boomsim.run import Load, run
from boomsim.workload import MULTI_TURN, Shape, stream

from boomerang.router.learning.costmodel import Shape as CostShape
from boomerang.router.learning.costmodel import decide
from boomerang.router.turn.plan import Facts, Plan, static_plan

SMALL = h200_qwen3_32b(kv_blocks=2_000)
"""32k tokens of KV per engine: eight conversations of 2-4k tokens and their leases exceed it."""


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Facts, Plan, Any]]:
    seen: list[tuple[Facts, Plan, Any]] = []
    original = policies.Planner.plan

    def plan(self: policies.Planner, facts: Facts) -> Plan:
        coefficients = self.model.coefficients()
        out = original(self, facts)
        seen.append((facts, out, coefficients))
        return out

    monkeypatch.setattr(policies.Planner, "plan", plan)
    return seen


def test_static_decides_as_plan_static_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _recorded(monkeypatch)
    topo = Topology(1, 1, p_caching=False)
    r = run(SMALL, topo, Settings("static"), stream(MULTI_TURN, 40, 1), Load(8, 8), check=True)
    assert len(seen) == r.summary["turns"]
    for facts, plan, _ in seen:
        assert plan == static_plan(facts, 64)
    chosen: dict[str, int] = {}
    for _, plan, _ in seen:
        chosen[plan.choice.value] = chosen.get(plan.choice.value, 0) + 1
    assert r.summary["paths"] == dict(sorted(chosen.items()))  # each turn ran what was chosen
    assert r.summary["paths"].get("pull", 0) > 0


def test_adaptive_decides_as_the_cost_model_with_what_it_learned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _recorded(monkeypatch)
    settings = Settings("adaptive", itl_budget_s=0.5)
    r = run(SMALL, Topology(1, 2), settings, stream(MULTI_TURN, 40, 2), Load(8, 8), check=True)
    bounds = policies.Planner(settings).bounds
    learned = 0
    for facts, plan, c in seen:
        shape = CostShape(
            facts.prompt_tokens,
            facts.reusable_tokens,
            facts.holder_continues,
            facts.pullable,
            p_cached_tokens=facts.p_cached_tokens,
            d_held_tokens=facts.d_held_tokens,
        )
        assert plan.choice is decide(c, shape, bounds).path
        learned += c.observations["prefill"] > 0
    assert learned > 0, "the cost model never learned: the test compared priors only"
    assert set(r.summary["paths"]) >= {"continue"}


@pytest.mark.parametrize("threshold, continued", [(0, False), (10**6, True)])
def test_decode_first_runs_on_the_decoder_alone_below_its_threshold(
    threshold: int, continued: bool
) -> None:
    settings = Settings("decode-first", decode_first_threshold=threshold)
    r = run(SMALL, Topology(1, 2), settings, stream(MULTI_TURN, 10, 3), Load(4, 4))
    paths = r.summary["paths"]
    assert (paths.get("continue", 0) == r.summary["turns"]) is continued
    assert (r.engines["p0"]["computed"] == 0) is continued


@pytest.mark.parametrize("policy", POLICIES)
def test_blocks_are_conserved_under_memory_pressure_in_every_policy(policy: str) -> None:
    shape = Shape(first=(3000, 5000))
    r = run(SMALL, Topology(1, 1), Settings(policy), stream(shape, 30, 4), Load(8, 8), check=True)
    assert r.summary["turns"] > 0
    evicted = sum(e["evicted_blocks"] for e in r.engines.values())
    assert evicted > 0, "no pressure: the run did not test what it says"
    if policy in policies.BIDIRECTIONAL:
        assert r.engines["d0"]["lease_ends"].get("yielded", 0) > 0


def test_plain_without_p_cache_recomputes_every_prompt_on_p() -> None:
    convs = list(stream(MULTI_TURN, 12, 5))
    r = run(SMALL, Topology(1, 1, p_caching=False), Settings("plain"), iter(convs), Load(4, 4))
    assert r.engines["p0"]["computed"] == sum(p for turns in convs for p, _, _ in turns)


@pytest.mark.parametrize(
    "think_s, path, end", [(10.0, "pull", "read"), (600.0, "recompute", "expired")]
)
def test_a_lease_serves_a_pull_until_ds_ttl_ends_it(think_s: float, path: str, end: str) -> None:
    conv = [(3000, 100, 0.0), (3200, 100, think_s)]
    topo = Topology(1, 1, p_caching=False)
    r = run(SMALL, topo, Settings("static"), iter([conv]), Load(rate=1.0), check=True)
    expected = {"pull": 1, "recompute": 1} if path == "pull" else {"recompute": 2}
    assert r.summary["paths"] == expected
    assert r.engines["d0"]["lease_ends"].get(end, 0) >= 1
    assert r.engines["p0"]["loaded"] == (3099 if path == "pull" else 0)


def _alone_share(policy: str, shape: Shape = MULTI_TURN, load: Load | None = None) -> float:
    """The share of turns a decoder served alone under `policy`."""
    r = run(SMALL, Topology(1, 2), Settings(policy), stream(shape, 12, 3), load or Load(2, 4))
    return r.summary["paths"].get("continue", 0) / r.summary["turns"]


def test_the_peers_rules_fire_as_the_router_s_do() -> None:
    """Issue 44: the peers' decode-first at thresholds that fire. Always: every turn on a
    decoder alone, first turns included. Dynamo's rule: no first turn (all of it is
    uncached, not under 0.7 of it), but short follow-ups. A threshold of 512 against tool
    results of 500-3,000 tokens fires less than 8,192."""
    assert _alone_share("decode-first-always") == 1.0
    dynamo = _alone_share("dynamo")
    first_turns = (
        12
        / run(
            SMALL, Topology(1, 2), Settings("plain"), stream(MULTI_TURN, 12, 3), Load(2, 4)
        ).summary["turns"]
    )
    assert 0 < dynamo <= 1 - first_turns + 1e-9
    tools = Shape(user=(500, 3000))
    assert _alone_share("decode-first-512", tools) < _alone_share("decode-first-8192", tools)


def test_dynamo_s_load_variant_skips_a_busy_p() -> None:
    """Under a burst that queues P, the load variant serves more turns on the decoder alone
    than the same rule that does not look at P's queue, first turns included."""
    burst = Load(rate=50.0, seed=3)
    shape = Shape(first=(3000, 5000))
    assert _alone_share("dynamo-load", shape, burst) > _alone_share("dynamo", shape, burst)


def test_each_swept_value_names_its_best_peer_per_figure() -> None:
    from boomsim.sweep import best_baselines, markdown

    def row(policy: str, follow: float, tps: float, goodput: float) -> dict[str, Any]:
        figures = {"first_p50": 1.0, "follow_p50": follow, "follow_p99": 2 * follow,
                   "tpot_p50": 0.02, "tpot_p99": 0.03, "gap_p99": 0.04, "kv_held": 0.25,
                   "goodput": goodput,
                   "attainment": goodput / tps}  # fmt: skip
        return {"ratio": "1P2D", "policy": policy, **figures, "turns_per_s": tps, "paths": {}}

    rows = [
        row("affinity", 0.3, 5.0, 2.0),
        row("dynamo", 0.1, 4.0, 3.0),
        row("adaptive", 0.05, 9.0, 8.0),
    ]
    best = best_baselines(rows, "ratio")["1P2D"]
    assert best["follow_p50"] == "dynamo"  # Boomerang's own rows are not peers
    assert best["turns_per_s"] == "affinity"  # throughput: the highest
    assert best["goodput"] == "dynamo"
    table = markdown(rows, "ratio")
    assert "| 1P2D | *best peer* | affinity | dynamo | dynamo |" in table
    assert (
        "| 1P2D | adaptive | 1.00 s | 50 ms | 100 ms | 20 ms / 30 ms | 40 ms | 25% | 8.00 (89%) |"
        in table
    )


def test_a_row_over_seeds_is_the_median_with_its_band() -> None:
    from boomsim.sweep import FIGURES, banded, markdown

    def run_of(seed: int, follow: float) -> dict[str, Any]:
        figures = dict.fromkeys(FIGURES, 1.0) | {"follow_p50": follow}
        return {"kv": 4, "policy": "adaptive", **figures, "turns": 10 + seed,
                "paths": {"pull": seed}}  # fmt: skip

    rows = banded([run_of(0, 0.3), run_of(1, 0.1), run_of(2, 0.2)], "kv")
    assert len(rows) == 1
    row = rows[0]
    assert row["follow_p50"] == 0.2 and row["band"]["follow_p50"] == [0.1, 0.3]
    assert row["paths"] == {"pull": 1} and row["seeds"] == 3
    assert "| 200 ms [100 ms-300 ms] |" in markdown(rows, "kv")
    assert "Medians over 3 seeds" in markdown(rows, "kv")


@pytest.mark.parametrize("p_caching", [True, False])
def test_simulated_static_forgoes_a_handle_p_already_holds_as_the_router_does(
    p_caching: bool,
) -> None:
    """Issue 44 item 1: the live static's rule (`plan.forgoes_handle`, `flow.Router._forgo`):
    when the P that computed the last prompt serves the turn and still caches it, the handle
    is let go unverified. Without P's prefix cache nothing is forgone."""
    topo = Topology(1, 1, p_caching=p_caching)
    r = run(SMALL, topo, Settings("static"), stream(MULTI_TURN, 12, 5), Load(2, 4), check=True)
    forgone = r.engines["d0"]["lease_ends"].get("forgone", 0)
    assert (forgone > 0) is p_caching


def test_p_s_cpu_tier_loads_the_prompts_its_gpu_cache_lost_but_never_the_answer() -> None:
    """llm-d's multi-tier P (issue 44 item 2): with P's KV too small for the histories, the
    tier's loads replace recomputation, and what a turn loads is at most the previous prompt
    (prompt-only offloading): the previous answer is still computed."""
    topo = Topology(1, 1, p_blocks=600)  # 9,600 tokens: two or three histories
    convs = list(stream(MULTI_TURN, 24, 7))
    plain = run(SMALL, topo, Settings("affinity"), iter(convs), Load(4, 8), check=True)
    tier = run(SMALL, topo, Settings("cpu-tier"), iter(convs), Load(4, 8), check=True)
    assert plain.engines["p0"]["tier_loaded"] == 0
    assert tier.engines["p0"]["tier_loaded"] > 0 and tier.engines["p0"]["loaded"] == 0
    assert tier.engines["p0"]["computed"] < plain.engines["p0"]["computed"]
    answers = sum(a for turns in convs for _, a, _ in turns[:-1])
    assert tier.engines["p0"]["computed"] >= answers
    assert tier.summary["follow_p50"] < plain.summary["follow_p50"]


def test_retained_leases_raise_the_kv_a_decoder_holds() -> None:
    """The same conversations: a decoder that retains each turn's blocks for the next (static)
    holds more of its KV on average than one that frees them (affinity)."""
    held = {}
    for policy in ("affinity", "static"):
        r = run(SMALL, Topology(1, 1), Settings(policy), stream(MULTI_TURN, 30, 5), Load(8, 8))
        held[policy] = r.summary["kv_held"]
    assert 0.0 < held["affinity"] < held["static"] <= 1.0
