"""The router's state document and the operator's reading of it share one description
(`boomerang.facts.state`): a real router, after real turns on the fake engines,
answers a document the operator turns into status fields."""

from __future__ import annotations

from typing import Any

from test_paths import ADAPTIVE, conversation

from boomerang.facts import state as router_state
from boomerang.operator import tuning
from boomerang.router.learning.costmodel import Path


def test_the_router_s_paths_are_the_contract_s() -> None:
    assert tuple(str(p) for p in Path) == router_state.PATHS


async def test_the_operator_reads_what_the_router_writes(world: Any) -> None:
    w = await world(**ADAPTIVE)  # the real retention and cost model: the document they write
    await conversation(w, 3)
    doc = await (await w.client.get(router_state.PATH)).json()
    assert router_state.missing(doc) == []
    fields = tuning.learned(doc)
    assert fields is not None and sum(fields["pathShares"].values()) in (99, 100, 101)
    assert {"breakEvenTokens", "retentionSeconds", "retainedBlocks"} <= set(fields)


async def test_a_static_router_reports_nothing_for_status(world: Any) -> None:
    w = await world()
    await conversation(w, 1)
    doc = await (await w.client.get(router_state.PATH)).json()
    assert router_state.missing(doc) == [] and tuning.learned(doc) is None
