"""`call_count`: function calls per routed turn, counted in a real router process."""

from __future__ import annotations

from call_count import count, table, totals


def test_totals_split_python_from_c_calls_per_turn() -> None:
    calls = {"flow.py:Router.handle": 8, "decode.py:answer_json": 8, "C:len": 24}
    assert totals(calls, 8) == (2.0, 3.0)


def test_the_table_lists_the_functions_that_changed_most_first() -> None:
    before = {"a.py:f": 80, "a.py:g": 8, "C:len": 16}
    after = {"a.py:f": 80, "a.py:g": 40, "b.py:h": 16, "C:len": 8}
    lines = table({"old": before, "new": after}, 8, top=3)
    assert lines[2:4] == ["| old | 11.0 | 2.0 |", "| new | 17.0 | 1.0 |"]
    assert [line.split(" | ")[0] for line in lines[-3:]] == [
        "| `a.py:g`",
        "| `b.py:h`",
        "| `C:len`",
    ]
    assert lines[-3] == "| `a.py:g` | 1.00 | 5.00 |"


def test_a_real_router_counts_the_same_calls_for_the_same_turns() -> None:
    first = count(None, conversations=3, warmup=2, stream=False)
    again = count(None, conversations=3, warmup=2, stream=False)
    turns = 3 * 8
    py, c = totals(first, turns)
    assert py > 100 and c > 100  # a routed turn: the flow, two engine calls, the answer
    assert first["validation.py:validate"] == turns  # each counted turn once, the warm-up not
    assert abs(totals(again, turns)[0] - py) < 0.02 * py  # a probe in one run: a few calls
