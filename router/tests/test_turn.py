"""A turn's handle as a state machine: each sequence of events ends in one stage and one reuse
outcome, a handle goes back to the store only when no P can have seen it, and every other
move is refused. Pure: no engine, no store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from boomerang.router import conversation as conv
from boomerang.router.apis.validation import validate
from boomerang.router.learning.costmodel import Path
from boomerang.router.metrics import PATHS, REUSE_OUTCOMES
from boomerang.router.turn.reuse import REJECTED, Outcome, Reuse
from boomerang.router.turn.state import MOVES, IllegalMove, Stage, Turn

HELD = list(range(100, 120))
PARAMS = {"remote_block_ids": [[1, 2, 3, 4, 5]], "remote_num_tokens": 20}
HANDLE = conv.build_handle(PARAMS, HELD, "http://d0", 1e12, 4)
HIT = Reuse(Outcome.HIT, 20, PARAMS)
PARTIAL = Reuse(Outcome.PARTIAL, 8, {"remote_block_ids": [[1, 2]], "remote_num_tokens": 8})

Step = Callable[[Turn], Any]


def take(usable: bool = True) -> Step:
    return lambda t: t.take("found", HANDLE, usable)


def verify(reuse: Reuse | None) -> Step:
    return lambda t: t.verify(reuse)


def attach(t: Turn) -> Any:
    return t.attach()


def unsent(t: Turn) -> None:
    t.unsent()


def spend(accepted: bool) -> Step:
    return lambda t: t.spend(accepted=accepted)


def detach(t: Turn) -> None:
    t.detach()


def decline(t: Turn) -> Any:
    return t.decline()


def continued(t: Turn) -> None:
    t.continued = True  # the holder answered the turn itself (the flow sets it)


def supersede(t: Turn) -> Any:
    return t.supersede()


def new_turn() -> Turn:
    return Turn(validate("chat", {"messages": [{"role": "user", "content": "x"}]}, None), "t")


# (name, events before the turn ends, stage, outcome, reused tokens, handle back in the store)
CASES = [
    ("nothing stored", [lambda t: t.take("missing", None, False)], Stage.NONE, "miss", 0, False),
    ("expired", [lambda t: t.take("expired", None, False)], Stage.NONE, "expired", 0, False),
    ("its decoder lost the blocks", [take(usable=False)], Stage.NONE, "fallback", 0, False),
    ("hit that P used", [take(), verify(HIT), attach, spend(True)], Stage.SPENT, "hit", 20, False),
    (
        "partial that P used",
        [take(), verify(PARTIAL), attach, spend(True)],
        Stage.SPENT,
        "partial",
        8,
        False,
    ),
    ("rejected: dropped", [take(), verify(REJECTED)], Stage.DROPPED, "rejected", 0, False),
    ("prompt ids unknown", [take(), verify(None)], Stage.RESTORED, "fallback", 0, True),
    (
        "P failed after it may have read it",
        [take(), verify(HIT), attach, spend(False)],
        Stage.SPENT,
        "fallback",
        0,
        False,
    ),
    (
        "refused by one P, used by the next",
        [take(), verify(HIT), attach, unsent, attach, spend(True)],
        Stage.SPENT,
        "hit",
        20,
        False,
    ),
    (
        "refused by every P",
        [take(), verify(PARTIAL), attach, unsent],
        Stage.RESTORED,
        "fallback",
        0,
        True,
    ),
    (
        "served alone after verifying",
        [take(), verify(HIT), detach],
        Stage.RESTORED,
        "fallback",
        0,
        True,
    ),
    ("held for a turn served alone", [take(), detach], Stage.RESTORED, "fallback", 0, True),
    (
        "served alone after P used it (D failed)",
        [take(), verify(HIT), attach, spend(True), detach],
        Stage.SPENT,
        "fallback",
        0,
        False,
    ),
    (
        "cancelled mid-prefill: P may be reading it",
        [take(), verify(HIT), attach],
        Stage.SPENT,
        "fallback",
        0,
        False,
    ),
    (
        "recompute chosen: declined",
        [take(), verify(HIT), decline],
        Stage.RELEASED,
        "fallback",
        0,
        False,
    ),
    (
        "continued, D's new handle filed",
        [take(), verify(HIT), continued, supersede],
        Stage.RELEASED,
        "hit",
        20,
        False,
    ),
    (
        "continued, no new handle filed: the old one still holds",
        [take(), verify(PARTIAL), continued],
        Stage.RESTORED,
        "partial",
        8,
        True,
    ),
]


@pytest.mark.parametrize(
    ("events", "stage", "outcome", "tokens", "restored"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_a_turn_ends_in_one_stage_and_outcome(
    events: list[Step], stage: Stage, outcome: str, tokens: int, restored: bool
) -> None:
    turn = new_turn()
    for event in events:
        event(turn)
    back = turn.restore()  # what the flow does when the turn ends
    assert (turn.stage, turn.outcome, turn.reused_tokens) == (stage, outcome, tokens)
    assert (back is HANDLE) is restored
    assert turn.summary()["reuse"] == outcome
    assert turn.restore() is None  # a handle goes back once


ILLEGAL = [
    ("verify without a handle", [verify(HIT)]),
    ("verify twice", [take(), verify(HIT), verify(HIT)]),
    ("attach twice on one request", [take(), verify(HIT), attach, attach]),
    ("spend what was not attached", [take(), verify(HIT), spend(True)]),
    ("spend twice", [take(), verify(HIT), attach, spend(True), spend(True)]),
    ("unsent without a request", [take(), verify(HIT), unsent]),
    ("take twice", [take(), take()]),
    ("verify after it was restored", [take(), lambda t: t.restore(), verify(HIT)]),
    ("decline what was not verified", [take(), decline]),
    ("decline what P has", [take(), verify(HIT), attach, decline]),
    ("decline twice", [take(), verify(HIT), decline, decline]),
    ("supersede without continuing", [take(), verify(HIT), supersede]),
]


@pytest.mark.parametrize("events", [c[1] for c in ILLEGAL], ids=[c[0] for c in ILLEGAL])
def test_every_other_move_is_refused(events: list[Step]) -> None:
    turn = new_turn()
    *before, last = events
    for event in before:
        event(turn)
    with pytest.raises(IllegalMove):
        last(turn)


def test_only_a_verified_handle_is_attached_and_as_decided() -> None:
    turn = new_turn()
    assert turn.attach() is None  # nothing taken: P computes the whole prompt
    take()(turn)
    assert turn.attach() is None  # taken, not verified
    turn.verify(PARTIAL)
    assert turn.attach() == PARTIAL.params
    turn.spend(accepted=True)
    assert turn.attach() is None  # spent: a prefill again (after a D failure) computes


def test_no_move_leaves_the_table() -> None:
    reachable = {to for _, to in MOVES} | {Stage.NONE}
    assert reachable == set(Stage)


def test_the_outcomes_are_the_metric_labels() -> None:
    assert tuple(Outcome) == REUSE_OUTCOMES


PATH_CASES = [
    ("nothing stored", [lambda t: t.take("missing", None, False)], Path.RECOMPUTE),
    ("pulled", [take(), verify(HIT), attach, spend(True)], Path.PULL),
    ("P declined it", [take(), verify(HIT), attach, spend(False)], Path.RECOMPUTE),
    ("recompute chosen", [take(), verify(PARTIAL), decline], Path.RECOMPUTE),
    ("continued", [take(), verify(PARTIAL), continued, supersede], Path.CONTINUE),
]


@pytest.mark.parametrize(
    ("events", "path"), [c[1:] for c in PATH_CASES], ids=[c[0] for c in PATH_CASES]
)
def test_a_turn_counts_the_path_that_served_it(events: list[Step], path: Path) -> None:
    turn = new_turn()
    for event in events:
        event(turn)
    turn.restore()
    assert turn.path is path
    assert turn.summary()["path"] == str(path)


def test_the_paths_are_the_metric_labels() -> None:
    assert tuple(Path) == PATHS


def test_decline_and_supersede_hand_over_the_handle_once() -> None:
    turn = new_turn()
    take()(turn)
    turn.verify(HIT)
    assert turn.decline() is HANDLE
    assert turn.attach() is None  # a declined handle is never offered to P
    assert turn.restore() is None
