"""The offline retention replay's accounting (pure): what each policy holds and hits."""

from __future__ import annotations

import pytest

from bench.agents import retention_frontier as rf


def rec(conv: str, turn: int, sent: float, done: float, prompt: int, new: int) -> dict:
    return {
        "conversation": conv,
        "turn": turn,
        "sent_s": sent,
        "done_s": done,
        "prompt_tokens": prompt,
        "new_tokens": new,
    }


def test_a_handle_holds_the_prompt_and_answer_until_the_next_turn() -> None:
    records = [rec("a", 1, 0.0, 1.0, 200, 200), rec("a", 2, 6.0, 7.0, 300, 40)]
    first, last = rf.holdings(records, block_size=128, last_output=20)
    assert first == rf.Holding(1.0, 3, 5.0)  # 300 - 40 = 260 tokens held: 3 blocks
    assert last == rf.Holding(7.0, 3, None)  # 300 + 20 tokens, never followed


def test_static_keeps_every_handle_for_d_s_ttl_and_offers_it_for_the_handle_ttl() -> None:
    items = [rf.Holding(0.0, 2, 5.0), rf.Holding(10.0, 1, 45.0), rf.Holding(60.0, 4, None)]
    got = rf.replay(items, rf.static(48.0), offered_s=38.0)
    assert (got.hits, got.returns) == (1, 2)  # 45 s is past the handle TTL: a miss
    assert got.block_s == pytest.approx(2 * 5.0 + 1 * 48.0 + 4 * 48.0)


def test_a_learned_rule_learns_a_gap_only_once_its_turn_came_back() -> None:
    seen: list[float | None] = []

    def policy(learner, now, _blocks):
        seen.append(learner.quantile(None, 0.5, now))
        return 100.0

    items = [rf.Holding(float(i), 1, 30.0) for i in range(25)]  # all return 30 s later
    rf.replay(items, policy)
    assert seen == [None] * 25  # every filing precedes every return: nothing known yet
    later = [*items, rf.Holding(100.0, 1, None)]
    seen.clear()
    rf.replay(later, policy)
    assert seen[-1] == pytest.approx(30.0, rel=0.07)  # 25 returns learned by then


def test_the_known_distribution_keeps_small_handles_longer() -> None:
    policy = rf.known_distribution(3.0, 1.3, 0.8, price=5e-4, ceiling_s=38.0)
    small, large = policy(None, 0.0, 2), policy(None, 0.0, 60)  # type: ignore[arg-type]
    assert large < small <= 38.0


def test_the_table_is_relative_to_the_first_row() -> None:
    rows = [("static", rf.Outcome(100.0, 9, 10)), ("q", rf.Outcome(40.0, 8, 10))]
    table = rf.format_table(rows)
    assert "| q | 40 | 0.40 | 80.0% | -10.0 pts |" in table
