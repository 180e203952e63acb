"""The SLO-aware path choice through the router and the fake engines (issue 48): a first turn
runs on a decoder alone only when P would make it miss its TTFT bound, the decoder files a
handle for it like any D, every turn that joins a decoder is charged to its live streams, and
a follow-up continues only while those streams have TPOT slack left."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from router_testing import chat, filed, post
from test_paths import paths, router_of, until

from boomerang.router.apis.protocol import CONTINUE_PARAMS
from boomerang.router.learning.costmodel import DEFAULT_PRIORS

ENGINES = {
    "prefill_spec": {"version": "0.33.0"},
    "decode_spec": {"stream_params": True, "version": "0.33.0"},
    "tuning": {"mode": "adaptive"},
}
FAST_D = dataclasses.replace(DEFAULT_PRIORS, p_fixed_s=5.0, d_compute_s_per_token=2e-4)
"""P slow, D as fast as P: a continue is the cheaper path wherever it is allowed."""
OPENING = [{"role": "user", "content": "tell me about the harbour at dawn " * 3}]


def swamp_prefill(router: Any) -> None:
    """A million tokens queued on every P, as the router counts them: 200 s at the priors,
    far past any first turn's TTFT bound."""
    for ep in router.prefill.endpoints.values():
        ep.work += 10**6


async def test_a_first_turn_waits_on_p_while_p_meets_its_ttft_bound(world: Any) -> None:
    w = await world(**ENGINES)
    router_of(w)
    status, _ = await post(w, chat(OPENING, conversation_id="idle"))
    assert status == 200
    await filed(w, 1)
    assert len(w.prefill[0].calls) == 1  # P prefilled it: on an idle P it meets its bound
    assert (await paths(w))["continue"] == 0


async def test_a_first_turn_runs_on_a_decoder_when_p_would_miss_its_bound(world: Any) -> None:
    w = await world(**ENGINES)
    router, retention = router_of(w)
    swamp_prefill(router)
    status, body = await post(w, chat(OPENING, conversation_id="busy"))
    assert status == 200, body
    await filed(w, 1)
    assert w.prefill[0].calls == []  # no prefill: the decoder computed the whole prompt
    assert w.decode[0].calls[-1]["kv_transfer_params"] == CONTINUE_PARAMS
    await until(lambda: _continued(w, 1))
    d = only(router.decode.endpoints)
    assert d.stalled_s > 0  # its prefill was charged to the decoder's streams
    # D filed a handle for it like any decoder: the next turn finds its history there
    messages = [*OPENING, body["choices"][0]["message"], {"role": "user", "content": "more"}]
    status, _ = await post(w, chat(messages, conversation_id="busy"))
    assert status == 200
    await until(lambda: _continued(w, 2))
    assert [c[0] for c in retention.calls][-2:] == ["filed", "superseded"]


@pytest.mark.parametrize(("stalled_s", "continued"), [(0.0, 1), (60.0, 0)])
async def test_a_follow_up_continues_only_while_ds_streams_have_slack(
    world: Any, stalled_s: float, continued: int
) -> None:
    """Four streams decode on the holder; the oldest has absorbed nothing, or a minute of
    stalls (past its budget: the continue would push it past its TPOT bound). The follow-up
    continues in the first case and takes P in the second (served either way)."""
    w = await world(**ENGINES)
    router, _ = router_of(w, FAST_D)
    status, body = await post(w, chat(OPENING, conversation_id="slack"))
    assert status == 200
    await filed(w, 1)
    d = only(router.decode.endpoints)
    d.inflight += 4
    d.begin()
    d.stall(stalled_s)
    messages = [*OPENING, body["choices"][0]["message"], {"role": "user", "content": "more"}]
    status, _ = await post(w, chat(messages, conversation_id="slack"))
    assert status == 200
    await until(lambda: _served(w, 2))  # counted just after the answer went out
    counts = await paths(w)
    assert counts["continue"] == continued
    assert counts["pull"] + counts["recompute"] == 2 - continued


async def _continued(w: Any, n: float) -> bool:
    return (await paths(w))["continue"] == n


async def _served(w: Any, n: float) -> bool:
    return sum((await paths(w)).values()) == n


def only(endpoints: dict[str, Any]) -> Any:
    (ep,) = endpoints.values()
    return ep
