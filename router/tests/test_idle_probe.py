"""The idle decoder probe (`idle_probe.py`): which decoders are probed and when (a table), what
a probe reads (a table: the engine's clock, else the router's), what the cost model keeps of
probes and streams, and the probe through the router against a fake decoder that takes a
known time per token: the derived TPOT bound follows the probe, not the streams."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from router_testing import chat, post

from boomerang.facts import state as router_state
from boomerang.router.app import ROUTER
from boomerang.router.engines.endpoints import Endpoint
from boomerang.router.engines.health import histogram_totals
from boomerang.router.engines.idle_probe import (
    PROBE_TOKENS,
    PROBE_TRIES,
    TPOT_HISTOGRAM,
    probe_plan,
    probed_tpot,
)
from boomerang.router.learning.costmodel import CostModel


def decoder(**state: Any) -> Endpoint:
    ep = Endpoint(url=state.pop("url", "http://d0"), role="decode")
    ep.probed_ok, ep.identified = True, True
    for key, value in state.items():
        setattr(ep, key, value)
    return ep


def prefill(**state: Any) -> Endpoint:
    ep = Endpoint(url="http://p0", role="prefill")
    ep.probed_ok, ep.identified = True, True
    for key, value in state.items():
        setattr(ep, key, value)
    return ep


@pytest.mark.parametrize(
    ("d_state", "p_state", "probed", "chosen"),
    [
        ({}, {}, {}, True),  # ready, idle, never probed
        ({}, {}, {"http://d0": 0.0}, False),  # probed since it joined
        ({"lost_at": 50.0}, {}, {"http://d0": 0.0}, True),  # lost and back: probed again
        ({"inflight": 1}, {}, {}, False),  # a turn of ours in flight there
        ({"live": {1: 0.0}}, {}, {}, False),  # a stream of ours decoding there
        ({"ejected": True}, {}, {}, False),
        ({"probed_ok": False}, {}, {}, False),  # not yet healthy
        ({"identified": False}, {}, {}, False),  # its /metrics not read: revision unknown
        ({"revision": "b"}, {"revision": "a"}, {}, False),  # no P it would pair with
        ({}, {"ejected": True}, {}, False),  # no ready P: it serves no turn
    ],
)
def test_which_decoders_are_probed(
    d_state: dict[str, Any], p_state: dict[str, Any], probed: dict[str, float], chosen: bool
) -> None:
    d = decoder(**d_state)
    assert probe_plan([d], [prefill(**p_state)], dict(probed)) == ([d] if chosen else [])


@pytest.mark.parametrize(
    ("before", "after", "short_s", "long_s", "read"),
    [
        ((1.5, 10), (1.507, 12), 0.02, 0.30, 0.007),  # the engine's clock, not the router's
        ((1.5, 10), (1.6, 13), 0.02, 0.30, None),  # another request finished: not idle
        ((1.5, 10), (1.507, 11), 0.02, 0.30, None),  # one of the two not counted: not idle
        (None, None, 0.02, 0.02 + PROBE_TOKENS * 0.009, 0.009),  # no histogram: timed here
        ((1.5, 10), None, 0.02, 0.02 + PROBE_TOKENS * 0.009, 0.009),  # it went missing
    ],
)
def test_what_a_probe_reads(
    before: tuple[float, float] | None,
    after: tuple[float, float] | None,
    short_s: float,
    long_s: float,
    read: float | None,
) -> None:
    got = probed_tpot(before, after, short_s, long_s)
    assert got == (None if read is None else pytest.approx(read))


def test_the_tpot_histogram_is_read_over_every_engine_of_the_page() -> None:
    page = (
        f"# TYPE {TPOT_HISTOGRAM} histogram\n"
        f'{TPOT_HISTOGRAM}_bucket{{le="+Inf",engine="0"}} 3.0\n'
        f'{TPOT_HISTOGRAM}_count{{engine="0"}} 3.0\n'
        f'{TPOT_HISTOGRAM}_sum{{engine="0"}} 0.5\n'
        f'{TPOT_HISTOGRAM}_count{{engine="1"}} 2.0\n'
        f'{TPOT_HISTOGRAM}_sum{{engine="1"}} 0.25\n'
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
    ).encode()
    assert histogram_totals(page, TPOT_HISTOGRAM) == (0.75, 5.0)
    assert histogram_totals(b"vllm:num_requests_running 0.0\n", TPOT_HISTOGRAM) is None
    assert histogram_totals(b"not { a page", TPOT_HISTOGRAM) is None


def test_the_idle_tpot_is_the_streams_fastest_until_a_probe_then_the_probes() -> None:
    model = CostModel()
    assert model.coefficients().idle_tpot_s == 0.0
    model.observe_stream(65, 0, 0, 3.0, 64 * 0.015)  # a loaded stream: 15 ms a token
    assert model.coefficients().idle_tpot_s == pytest.approx(0.015)
    model.observe_stream(65, 0, 0, 3.0, 64 * 0.012)
    assert model.coefficients().idle_tpot_s == pytest.approx(0.012)
    model.observe_idle_tpot(0.006)
    assert model.coefficients().idle_tpot_s == pytest.approx(0.006)
    model.observe_idle_tpot(0.009)  # a probe another router's traffic slowed
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        model.observe_idle_tpot(bad)
    assert model.coefficients().idle_tpot_s == pytest.approx(0.006)
    # a stream that read faster than the probe: its tokens reached the router in a burst
    model.observe_stream(65, 0, 0, 0.0, 64 * 0.004)
    assert model.coefficients().idle_tpot_s == pytest.approx(0.006)


async def _state(w: Any) -> dict[str, Any]:
    resp = await w.client.get(router_state.PATH)
    assert resp.status == 200
    data: dict[str, Any] = await resp.json()
    return data


async def _probed(w: Any, d: int = 0) -> list[dict[str, Any]]:
    """D's calls that are probes (no kv_transfer_params, ignore_eos), once both are in."""
    for _ in range(300):
        calls = [c for c in w.decode[d].calls if c.get("ignore_eos")]
        if len(calls) >= 2:
            return calls
        await asyncio.sleep(0.02)
    return [c for c in w.decode[d].calls if c.get("ignore_eos")]


async def test_the_router_probes_an_idle_decoder_and_derives_its_tpot_bound_from_it(
    world: Any,
) -> None:
    w = await world(
        decode_spec={"tpot_s": 0.01},
        health={"probe_interval_s": 0.05, "idle_probe": True},
        tuning={"mode": "adaptive"},
    )
    calls = await _probed(w)
    assert [c["max_tokens"] for c in calls] == [1, 1 + PROBE_TOKENS]
    first, second = (c["prompt"].split() for c in calls)
    assert len(first) == len(second) and first != second  # both prefill alike, neither cached
    assert all("kv_transfer_params" not in c for c in calls)  # a plain request, D keeps nothing
    model = w.client.server.app[ROUTER].paths.model
    for _ in range(100):
        if model.coefficients().idle_tpot_s:
            break
        await asyncio.sleep(0.02)
    measured = model.coefficients().idle_tpot_s
    assert 0.009 <= measured <= 0.05, measured  # 10 ms a token; a loaded host adds to it
    slo = (await _state(w))[router_state.SLO]
    assert slo["tpot_s"] == pytest.approx(slo["scale"] * measured)
    # Once per engine start: turns served, more probe rounds, no second probe
    status, _ = await post(w, chat([{"role": "user", "content": "hello there"}]))
    assert status == 200
    await asyncio.sleep(0.3)
    assert len([c for c in w.decode[0].calls if c.get("ignore_eos")]) == 2


async def _learned(w: Any) -> float:
    model = w.client.server.app[ROUTER].paths.model
    for _ in range(150):
        if model.coefficients().idle_tpot_s:
            break
        await asyncio.sleep(0.02)
    return float(model.coefficients().idle_tpot_s)


async def test_the_probe_reads_the_decoders_own_clock_when_it_publishes_one(world: Any) -> None:
    """The router's clock sees 10 ms a token (the fake sleeps so), the decoder's histogram says
    7: the router keeps the decoder's, which no stall of its own event loop can move."""
    w = await world(
        decode_spec={"tpot_s": 0.01, "clock_tpot_s": 0.007},
        health={"probe_interval_s": 0.05, "idle_probe": True},
        tuning={"mode": "adaptive"},
    )
    assert await _learned(w) == pytest.approx(0.007)
    assert len([c for c in w.decode[0].calls if c.get("ignore_eos")]) == 2


@pytest.mark.parametrize(("busy", "probes", "learned"), [(1, 2, 0.007), (9, PROBE_TRIES, 0.0)])
async def test_a_decoder_found_busy_is_probed_again_a_few_times(
    world: Any, busy: int, probes: int, learned: float
) -> None:
    """Another request finished beside the probe's: the decoder was not idle, nothing is kept,
    and the router asks again at its next look, `PROBE_TRIES` times in all per engine start."""
    w = await world(
        decode_spec={"tpot_s": 0.0, "clock_tpot_s": 0.007, "finished_beside": busy},
        health={"probe_interval_s": 0.05, "idle_probe": True},
        tuning={"mode": "adaptive"},
    )
    await _learned(w) if learned else await asyncio.sleep(1.0)
    await asyncio.sleep(0.3)
    calls = [c for c in w.decode[0].calls if c.get("ignore_eos")]
    assert len(calls) == 2 * probes
    model = w.client.server.app[ROUTER].paths.model
    assert model.coefficients().idle_tpot_s == pytest.approx(learned)


async def test_no_probe_when_turned_off(world: Any) -> None:
    w = await world(
        decode_spec={"tpot_s": 0.01}, health={"probe_interval_s": 0.05, "idle_probe": False}
    )
    status, _ = await post(w, chat([{"role": "user", "content": "hello there"}]))
    assert status == 200
    await asyncio.sleep(0.3)
    assert w.decode[0].calls  # the turn reached D
    assert not [c for c in w.decode[0].calls if c.get("ignore_eos")]
