"""How long a handle is kept (the learned inter-turn gap, censoring included) and the ledger of
the leases D holds for the router: pure, with synthetic clocks and seeded log-normal gaps."""

from __future__ import annotations

import dataclasses
import math
import random
from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boomerang.router.retention.policy import (
    GapLearner,
    Lease,
    Ledger,
    RetentionBounds,
    retention_s,
)

MU, SIGMA = math.log(60.0), 1.0
"""Think times: log-normal, median a minute."""


def true_quantile(q: float, mu: float = MU, sigma: float = SIGMA) -> float:
    return math.exp(mu + sigma * NormalDist().inv_cdf(q))


def gaps(n: int, seed: int, mu: float = MU) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(mu, SIGMA) for _ in range(n)]


# --- the gap learner --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("q", "rel"), [(0.5, 0.03), (0.75, 0.03), (0.9, 0.03), (0.95, 0.03), (0.99, 0.05)]
)
def test_quantiles_of_log_normal_gaps(q: float, rel: float) -> None:
    g = GapLearner()
    for x in gaps(20_000, seed=1):
        g.observe(None, x, now=0.0)
    # q 0.99: the estimate ends at the last 0.1% followed, so it reads q 0.989 (3.6% low here)
    assert g.quantile(None, q, now=0.0) == pytest.approx(true_quantile(q), rel=rel)


def test_a_few_late_returns_after_heavy_censoring_do_not_take_over() -> None:
    g = GapLearner()
    for x in gaps(5000, seed=9):
        g.observe(None, min(x, 3000.0), 0.0)
    for _ in range(5000):
        g.observe_censored(None, 3600.0, 0.0)
    g.observe(None, 5000.0, 0.0)  # followed longer than the rest, by chance
    assert g.quantile(None, 0.9, 0.0) == pytest.approx(true_quantile(0.9), rel=0.06)


def test_censoring_lowers_the_bias() -> None:
    """Conversations cut at a random time (released, no return seen): dropping them biases the
    estimate low; counting them as censored recovers the quantile."""
    rng = random.Random(2)
    km, naive = GapLearner(), GapLearner()
    for x in gaps(20_000, seed=3):
        cut = rng.uniform(10, 2000)
        if x <= cut:
            km.observe("t", x, 0.0)
            naive.observe("t", x, 0.0)
        else:
            km.observe_censored("t", cut, 0.0)
    for q in (0.5, 0.9):
        want = true_quantile(q)
        got, dropped = km.quantile("t", q, 0.0), naive.quantile("t", q, 0.0)
        assert got is not None and dropped is not None
        assert abs(got - want) < abs(dropped - want) / 3
        assert got == pytest.approx(want, rel=0.05)


def test_conversations_that_never_return_do_not_stretch_retention() -> None:
    g = GapLearner()
    for x in gaps(5000, seed=4):  # followed for an hour (the tombstones' horizon)
        if x < 3600.0:
            g.observe(None, x, 0.0)
        else:
            g.observe_censored(None, 3600.0, 0.0)
    for _ in range(5000):  # as many never came back within the hour
        g.observe_censored(None, 3600.0, 0.0)
    assert g.quantile(None, 0.9, 0.0) == pytest.approx(true_quantile(0.9), rel=0.06)


def test_nothing_until_enough_samples_then_tenant_falls_back_to_the_deployment() -> None:
    g = GapLearner(min_tenant_samples=5, min_samples=10)
    for i in range(9):
        g.observe("a", 100.0 + i, 0.0)
    assert g.quantile("a", 0.5, 0.0) == pytest.approx(104.0, rel=0.03)  # a has 9 >= 5
    assert g.quantile(None, 0.5, 0.0) is None  # the deployment has 9 < 10
    assert g.quantile("b", 0.5, 0.0) is None
    g.observe("b", 10.0, 0.0)
    assert g.quantile("b", 0.5, 0.0) is not None  # b has 1: the deployment's (10 samples)
    assert g.quantile("b", 0.5, 0.0) == g.quantile(None, 0.5, 0.0)
    assert g.quantile("", 0.5, 0.0) == g.quantile(None, 0.5, 0.0)
    assert g.samples("a", 0.0) == pytest.approx(9.0)
    assert g.samples(None, 0.0) == pytest.approx(10.0)


def test_tenants_learn_their_own_gaps() -> None:
    g = GapLearner()
    for x in gaps(2000, seed=5, mu=math.log(5.0)):
        g.observe("fast", x, 0.0)
    for x in gaps(2000, seed=6, mu=math.log(500.0)):
        g.observe("slow", x, 0.0)
    fast, slow = g.quantile("fast", 0.5, 0.0), g.quantile("slow", 0.5, 0.0)
    assert fast == pytest.approx(5.0, rel=0.1)
    assert slow == pytest.approx(500.0, rel=0.1)


def test_old_traffic_fades() -> None:
    g = GapLearner(half_life_s=600.0)
    for x in gaps(2000, seed=7, mu=math.log(10.0)):
        g.observe(None, x, 0.0)
    assert g.samples(None, 600.0) == pytest.approx(1000.0)
    for x in gaps(2000, seed=8, mu=math.log(300.0)):
        g.observe(None, x, 36_000.0)  # ten hours later: 60 half-lives
    assert g.quantile(None, 0.5, 36_000.0) == pytest.approx(300.0, rel=0.1)
    assert g.quantile(None, 0.5, 10**7) is None  # all faded


def test_weights_are_rescaled_over_a_long_run() -> None:
    g = GapLearner(half_life_s=1.0)
    for i in range(500):
        g.observe(None, 50.0, now=float(i))  # 500 half-lives
    assert g.samples(None, 499.0) == pytest.approx(2.0, rel=1e-3)
    assert g.quantile(None, 0.5, 499.0) is None


def test_bad_observations_are_ignored() -> None:
    g = GapLearner(min_samples=1)
    for bad in (-1.0, math.nan, math.inf):
        g.observe(None, bad, 0.0)
        g.observe_censored(None, bad, 0.0)
    g.observe(None, 10.0, math.nan)
    assert g.quantile(None, 0.5, 0.0) is None
    with pytest.raises(ValueError):
        g.quantile(None, 1.5, 0.0)


def test_extreme_gaps_stay_in_the_observed_range() -> None:
    g = GapLearner(min_samples=1)
    g.observe(None, 0.0, 0.0)
    g.observe(None, 10**6, 0.0)
    assert 0.0 <= g.quantile(None, 0.0, 0.0) <= 0.1  # the first bucket: 0 to 0.1 s
    assert 86_400 <= g.quantile(None, 1.0, 0.0) <= 10**6  # the last bucket: a day and more


def test_the_least_recent_tenant_is_forgotten() -> None:
    g = GapLearner(min_tenant_samples=1, min_samples=100, max_tenants=2)
    for t in ("a", "b", "a", "c"):
        g.observe(t, 10.0, 0.0)
    assert g.samples("b", 0.0) == 0.0
    assert g.quantile("a", 0.5, 0.0) is not None and g.quantile("c", 0.5, 0.0) is not None


@settings(max_examples=150, deadline=None)
@given(
    exact=st.lists(st.floats(0, 200_000), min_size=1, max_size=60),
    censored=st.lists(st.floats(0, 200_000), max_size=60),
    qs=st.lists(st.floats(0, 1), min_size=2, max_size=8),
)
def test_quantile_is_monotone_and_within_the_observed_range(
    exact: list[float], censored: list[float], qs: list[float]
) -> None:
    g = GapLearner(min_samples=1, half_life_s=50.0)
    for i, x in enumerate(exact):
        g.observe("t", x, now=float(i))
    for i, x in enumerate(censored):
        g.observe_censored("t", x, now=float(i))
    now = float(len(exact))
    got = [g.quantile(None, q, now) for q in sorted(qs)]
    if g.samples(None, now) < 1:
        assert got == [None] * len(qs)
        return
    values = [v for v in got if v is not None]
    assert len(values) == len(got)
    assert values == sorted(values)
    assert all(min(exact) <= v <= max(exact) for v in values)


# --- retention bounds -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("learned", "want"),
    [
        (None, 400.0),
        (math.nan, 400.0),
        (math.inf, 400.0),
        (3.0, 10.0),
        (143.0, 143.0),
        (900.0, 400.0),
    ],
)
def test_retention_is_the_ceiling_until_learned_then_clamped(
    learned: float | None, want: float
) -> None:
    assert retention_s(learned, RetentionBounds()) == want


def test_the_ceiling_wins_over_the_minimum() -> None:
    assert retention_s(5.0, RetentionBounds(min_s=60.0, ceiling_s=30.0)) == 30.0


@pytest.mark.parametrize(
    "bad", [{"quantile": 1.0}, {"quantile": 0.0}, {"min_s": -1.0}, {"ceiling_s": 0.0}]
)
def test_bad_retention_bounds_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetentionBounds(**bad)


# --- the ledger -------------------------------------------------------------------------------


def lease(
    key: str, blocks: int = 10, *, url: str = "http://d0", at: float = 0.0, ttl: float = 100.0
) -> Lease:
    return Lease(key.encode(), url, f"req-{key}", blocks, at, at + ttl, "t")


def test_add_returns_the_lease_it_supersedes() -> None:
    ledger = Ledger()
    first = lease("a")
    assert ledger.add(first) is None
    second = lease("a", 4, at=5.0)
    assert ledger.add(second) is first
    assert ledger.held_blocks() == 4 and ledger.held_blocks("http://d0") == 4
    assert len(ledger) == 1 and ledger.get(b"a") is second


def test_pop_and_held_blocks_per_decoder() -> None:
    ledger = Ledger()
    ledger.add(lease("a", 10))
    ledger.add(lease("b", 5, url="http://d1"))
    assert ledger.held_blocks() == 15
    assert ledger.held_blocks("http://d1") == 5 and ledger.held_blocks("http://nope") == 0
    assert ledger.pop(b"a") is not None and ledger.pop(b"a") is None
    assert ledger.held_blocks() == 5 and ledger.held_blocks("http://d0") == 0


def test_due_lists_expired_leases_soonest_first_and_follows_renewals() -> None:
    ledger = Ledger()
    ledger.add(lease("late", ttl=50))
    ledger.add(lease("soon", ttl=10))
    ledger.add(lease("later", ttl=500))
    assert ledger.due(9.0) == []
    assert [x.request_id for x in ledger.due(60.0)] == ["req-soon", "req-late"]
    renewed = ledger.get(b"soon")
    assert renewed is not None
    renewed.deadline = 200.0  # renewed by D: a new deadline
    assert [x.request_id for x in ledger.due(60.0)] == ["req-late"]
    assert len(ledger) == 3  # due() only lists


def test_over_budget_releases_soonest_deadlines_first_down_to_the_budget() -> None:
    ledger = Ledger()
    for i, ttl in enumerate([30, 10, 20, 40]):
        ledger.add(lease(f"k{i}", 25, ttl=ttl))
    ledger.add(lease("other", 1000, url="http://d1", ttl=1))
    assert ledger.over_budget("http://d0", total_blocks=200, fraction=0.5) == []  # 100 <= 100
    out = ledger.over_budget("http://d0", total_blocks=100, fraction=0.5)
    assert [x.key for x in out] == [b"k1", b"k2"]  # 100 - 50 <= 50
    out = ledger.over_budget("http://d0", total_blocks=100, fraction=0.3)
    assert [x.key for x in out] == [b"k1", b"k2", b"k0"]  # 25 <= 30
    assert len(ledger.over_budget("http://d0", total_blocks=100, fraction=0.0)) == 4
    assert ledger.over_budget("http://d0", total_blocks=0, fraction=0.5) == []  # unknown total


def test_over_budget_releases_first_what_p_still_holds() -> None:
    """Under D's budget, a lease whose history a prefill engine still holds goes first (P
    recomputes it from its own cache); what P forgot stays (only a pull brings it back)."""
    ledger = Ledger()
    probes = {"soon": 1, "mid": 2, "late": 3, "none": None}
    for key, ttl in (("soon", 10), ("mid", 20), ("late", 30), ("none", 5)):
        ledger.add(dataclasses.replace(lease(key, 25, ttl=ttl), p_probe=probes[key]))
    on_p = {3}.__contains__  # P holds only the latest-due lease's history
    out = ledger.over_budget("http://d0", total_blocks=100, fraction=0.5, p_holds=on_p)
    assert [x.key for x in out] == [b"late", b"none"]  # then soonest due; no probe: not on P
    out = ledger.over_budget("http://d0", total_blocks=100, fraction=0.5)  # no index
    assert [x.key for x in out] == [b"none", b"soon"]


def test_over_budget_shares_what_d_keeps_fairly_between_tenants() -> None:
    """A tenant whose clients ask for long retention (deadlines always the latest) holds most
    of D; under the budget it gives first, down to the other tenants' holdings, instead of
    the soonest deadlines (the other tenants') going first. What P still holds goes before
    either, whoever's it is."""
    ledger = Ledger()
    for i in range(6):  # "hint": 6 x 10 blocks, an hour each
        ledger.add(dataclasses.replace(lease(f"h{i}", 10, ttl=3600.0 + i), tenant="hint"))
    for i in range(2):  # "plain": 2 x 10 blocks, learned retention of a minute
        ledger.add(dataclasses.replace(lease(f"p{i}", 10, ttl=60.0 + i), tenant="plain"))
    out = ledger.over_budget("http://d0", total_blocks=100, fraction=0.4)  # 80 held, keep 40
    assert [x.key for x in out] == [b"h0", b"h1", b"h2", b"h3"]  # plain keeps its 20
    out = ledger.over_budget("http://d0", total_blocks=100, fraction=0.2)  # keep 20: 10 each
    assert sorted(x.key for x in out) == [b"h0", b"h1", b"h2", b"h3", b"h4", b"p0"]
    on_p = {7}.__contains__  # P still holds one of plain's conversations
    probe = dataclasses.replace(ledger.get(b"p1"), p_probe=7)  # type: ignore[type-var]
    ledger.add(probe)
    out = ledger.over_budget("http://d0", total_blocks=100, fraction=0.4, p_holds=on_p)
    assert [x.key for x in out] == [b"p1", b"h0", b"h1", b"h2"]


def test_block_seconds_integrate_held_blocks_over_time() -> None:
    ledger = Ledger()
    assert ledger.block_seconds(0.0) == 0.0
    ledger.add(lease("a", 10, at=0.0))
    ledger.add(lease("b", 5, at=10.0))
    ledger.pop(b"a", now=20.0)
    assert ledger.block_seconds(30.0) == pytest.approx(10 * 20 + 5 * 20)
    ledger.add(lease("b", 1, at=30.0))  # superseded: 5 blocks become 1
    assert ledger.block_seconds(40.0) == pytest.approx(300 + 10)
    ledger.pop(b"b")  # no time given: stops counting at the latest time seen (40)
    assert ledger.block_seconds(100.0) == pytest.approx(310)
    assert ledger.block_seconds(50.0) == pytest.approx(310)  # never backwards


def test_a_released_conversation_that_returns_gives_its_gap_once() -> None:
    ledger = Ledger(tombstone_s=1000.0)
    gone = lease("a", at=100.0)
    ledger.tombstone(gone, now=150.0)
    assert ledger.returned(b"nope", 200.0) is None
    assert ledger.returned(b"a", 400.0) == 300.0
    assert ledger.returned(b"a", 500.0) is None
    assert ledger.censored(5000.0) == []  # it came back: never censored too


def test_a_released_conversation_that_never_returns_is_censored_once() -> None:
    ledger = Ledger(tombstone_s=1000.0)
    ledger.tombstone(lease("a", at=100.0), now=150.0)
    ledger.tombstone(lease("b", at=600.0), now=650.0)
    assert ledger.censored(1099.0) == []
    out = ledger.censored(1100.0)
    assert [(x.key, s) for x, s in out] == [(b"a", 1000.0)]
    assert ledger.censored(1100.0) == []
    assert ledger.returned(b"a", 1200.0) is None


def test_a_new_lease_drops_the_tombstone_and_full_tombstones_are_censored() -> None:
    ledger = Ledger(tombstone_s=1000.0, max_tombstones=2)
    ledger.tombstone(lease("a"), now=10.0)
    ledger.add(lease("a", at=20.0))
    assert ledger.returned(b"a", 30.0) is None
    for k in ("x", "y", "z"):
        ledger.tombstone(lease(k, at=1.0), now=40.0)
    assert [(x.key, s) for x, s in ledger.censored(50.0)] == [(b"x", 39.0)]
    assert ledger.returned(b"z", 60.0) == 59.0


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "pop"]),
            st.sampled_from([b"a", b"b", b"c", b"d"]),
            st.sampled_from(["http://d0", "http://d1"]),
            st.integers(0, 50),
            st.floats(0, 10, allow_nan=False),
        ),
        max_size=40,
    )
)
def test_ledger_accounting_matches_a_simple_model(
    ops: list[tuple[str, bytes, str, int, float]],
) -> None:
    ledger, held, now, integral = Ledger(), dict[bytes, Lease](), 0.0, 0.0
    for op, key, url, blocks, step in ops:
        integral += sum(x.blocks for x in held.values()) * step
        now += step
        if op == "add":
            x = Lease(key, url, "r", blocks, now, now + 5, "t")
            assert ledger.add(x, now) is held.get(key)
            held[key] = x
        else:
            assert ledger.pop(key, now) is held.pop(key, None)
        assert ledger.held_blocks() == sum(x.blocks for x in held.values())
        for u in ("http://d0", "http://d1"):
            assert ledger.held_blocks(u) == sum(
                x.blocks for x in held.values() if x.decode_url == u
            )
            budget = ledger.over_budget(u, 100, 0.2)
            left = ledger.held_blocks(u) - sum(x.blocks for x in budget)
            assert left <= 20 and (not budget or left + budget[-1].blocks > 20)
        due = ledger.due(now)
        assert due == sorted(due, key=lambda x: x.deadline)
        assert {x.key for x in due} == {k for k, x in held.items() if x.deadline <= now}
    assert ledger.block_seconds(now) == pytest.approx(integral)


# --- the pieces together ----------------------------------------------------------------------


def retention_loop(*, tombstones: bool, start_s: float, turns: int = 4000) -> list[float]:
    """Retention at each turn when the router keeps handles for the learned q 0.9 and learns
    from its own releases: 30% of conversations never return, the rest after log-normal gaps.
    The first 200 turns keep `start_s` (say, a short one learned from earlier traffic)."""
    rng, g, ledger = random.Random(5), GapLearner(), Ledger(tombstone_s=3600.0)
    bounds = RetentionBounds(quantile=0.9, min_s=10.0, ceiling_s=3600.0)
    seen: list[float] = []
    for i in range(turns):
        now = float(i)
        r = start_s if i < 200 else retention_s(g.quantile(None, 0.9, now), bounds)
        seen.append(r)
        lease = Lease(f"c{i}".encode(), "http://d0", "r", 1, now, now + r, "t")
        ledger.add(lease, now)
        gap = rng.lognormvariate(MU, SIGMA) if rng.random() > 0.3 else math.inf
        ledger.pop(lease.key, now)
        if gap <= r:  # a hit: the turn took the handle
            g.observe(None, gap, now)
        elif not tombstones:  # what not to do: censor at the release
            g.observe_censored(None, r, now)
        else:
            ledger.tombstone(lease, now)
            if gap < 3600.0:
                returned = ledger.returned(lease.key, now + gap)
                assert returned == pytest.approx(gap)
                g.observe(None, returned, now)
            for x, at_least in ledger.censored(now + 3600.0):
                g.observe_censored(x.tenant, at_least, now)
    return seen


def test_learned_retention_recovers_from_its_own_releases() -> None:
    want = true_quantile(0.9)
    for start_s in (30.0, 3600.0):
        seen = retention_loop(tombstones=True, start_s=start_s)
        assert sum(seen[-1000:]) / 1000 == pytest.approx(want, rel=0.15)
    # Censoring at the release instead ratchets a short retention down for good.
    assert max(retention_loop(tombstones=False, start_s=30.0)[200:]) < want / 4
