"""P/D pairing by engine revision and vLLM version: while a rollout runs two, a turn's P and D
share one (vLLM's NIXL handshake refuses two vLLM releases, whatever the revisions say)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from router_testing import chat, filed, post

from boomerang.facts.engine import ENGINE_REVISION_METRIC
from boomerang.router.app import ROUTER
from boomerang.router.engines.endpoints import Endpoint, Pool, compatible, pairable, partners
from boomerang.router.engines.health import capabilities_from_metrics, revision_from_metrics


def ep(url: str, role: str, revision: str | None, version: str | None = None) -> Endpoint:
    return Endpoint(url, role, revision=revision, version=version)  # type: ignore[arg-type]


def page(*revisions: str) -> bytes:
    registry = CollectorRegistry()
    gauge = Gauge(ENGINE_REVISION_METRIC, "revision", ["revision"], registry=registry)
    for r in revisions:
        gauge.labels(revision=r).set(1)
    return generate_latest(registry)


@pytest.mark.parametrize(
    ("a", "b", "ok"),
    [("r1", "r1", True), ("r1", "r2", False), (None, "r2", True), ("r1", None, True)],
)
def test_engines_pair_within_one_revision_or_when_one_does_not_say(
    a: str | None, b: str | None, ok: bool
) -> None:
    assert compatible(ep("p", "prefill", a), ep("d", "decode", b)) is ok


@pytest.mark.parametrize(
    ("a", "b", "ok"),
    [("0.34.0", "0.34.0", True), ("0.32.0", "0.34.0", False), ("0.33.0", "0.34.0", False),
     (None, "0.34.0", True), ("0.32.0+cpu", None, True)],
)  # fmt: skip
def test_engines_of_two_vllm_releases_never_pair_even_within_one_revision(
    a: str | None, b: str | None, ok: bool
) -> None:
    assert compatible(ep("p", "prefill", "r1", a), ep("d", "decode", "r1", b)) is ok
    assert compatible(ep("p", "prefill", None, a), ep("d", "decode", None, b)) is ok


def test_a_rolled_prefill_is_not_offered_while_decode_is_held_on_the_old_revision() -> None:
    old_p, new_p = ep("p0", "prefill", "old"), ep("p1", "prefill", "new")
    old_d = ep("d0", "decode", "old")
    assert pairable([old_p, new_p], [old_d]) == [old_p]
    assert partners(new_p, [old_d]) == []
    assert pairable([new_p], [old_d]) == []  # no pair: the router serves alone or says why


def test_a_decoder_is_chosen_among_the_partners_of_the_chosen_prefill() -> None:
    p = ep("p0", "prefill", "new")
    decoders = [ep("d0", "decode", "old"), ep("d1", "decode", "new"), ep("d2", "decode", None)]
    assert [d.url for d in partners(p, decoders)] == ["d1", "d2"]


def test_the_revision_is_read_from_the_engines_metrics_page() -> None:
    assert revision_from_metrics(page("3f2a9c")) == "3f2a9c"
    assert revision_from_metrics(b"vllm:num_requests_running 0\n") is None
    assert revision_from_metrics(page("a", "b")) is None  # ambiguous: pairs with any
    assert revision_from_metrics(b"not a {metrics page") is None


def test_the_plugin_s_capabilities_are_read_from_the_same_page() -> None:
    page_ = (
        b"# TYPE boomerang_engine_capability_info gauge\n"
        b'boomerang_engine_capability_info{capability="continue"} 1.0\n'
        b'boomerang_engine_capability_info{capability="later"} 0.0\n'
    )
    assert capabilities_from_metrics(page_) == {"continue"}  # a 0 is not in force
    assert capabilities_from_metrics(b"vllm:num_requests_running 0\n") == frozenset()
    assert capabilities_from_metrics(b"not a {metrics page") == frozenset()


def test_an_ejected_engine_is_identified_again_when_it_comes_back() -> None:
    pool = Pool("decode", eject_after=1)
    d = ep("d0", "decode", "old")
    d.identified = True
    pool.endpoints = {"d0": d}
    d.version = "0.32.0"
    assert pool.failed(d)
    assert not d.identified  # it may come back as another build
    assert d.version is None


# Through the router and the fake engines: each engine publishes its revision on /metrics.


async def identified(w: Any) -> None:
    """Wait until the router has read every engine's revision (its first probes)."""
    pools = (w.client.server.app[ROUTER].prefill, w.client.server.app[ROUTER].decode)
    for _ in range(300):
        if all(ep.identified for pool in pools for ep in pool.endpoints.values()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the router never read the engines' revisions")


def revisions(*names: str | None) -> list[dict[str, Any]]:
    return [{"revision": name} for name in names]


async def conversation(w: Any, turns: int) -> None:
    history = [{"role": "user", "content": "tell me about the tides " * 8}]
    for i in range(turns):
        status, body = await post(w, chat(history, conversation_id="c"))
        assert status == 200, body
        await filed(w, i + 1)
        history += [body["choices"][0]["message"], {"role": "user", "content": f"and {i}?"}]


async def test_turns_use_only_the_prefill_that_has_a_decoder_of_its_revision(world: Any) -> None:
    w = await world(
        n_prefill=2, prefill_spec=revisions("old", "new"), decode_spec={"revision": "old"}
    )
    await identified(w)
    await conversation(w, 4)
    assert w.prefill[1].calls == []  # the rolled P has no partner while D is held
    assert len(w.prefill[0].calls) >= 4 and await w.reuse("hit") == 3
    assert w.fabric.violations == []


async def test_the_decoder_is_one_of_the_prefills_revision(world: Any) -> None:
    w = await world(
        n_decode=2, prefill_spec={"revision": "new"}, decode_spec=revisions("old", "new")
    )
    await identified(w)
    await conversation(w, 3)
    assert w.decode[0].calls == [] and len(w.decode[1].calls) == 3
    assert await w.reuse("hit") == 2


async def test_a_conversation_stays_within_its_decoders_revision(world: Any) -> None:
    """Both revisions have a pair: every KV hand-over, either way, is within one revision."""
    w = await world(
        n_prefill=2,
        n_decode=2,
        prefill_spec=revisions("old", "new"),
        decode_spec=revisions("old", "new"),
    )
    await identified(w)
    await conversation(w, 5)
    revision = {spec.engine_id: spec.revision for spec in [*w.prefill, *w.decode]}
    moves = [  # (reader, the engine whose blocks it read)
        (spec.engine_id, call["kv_transfer_params"]["remote_engine_id"])
        for spec in [*w.prefill, *w.decode]
        for call in spec.calls
        if (call.get("kv_transfer_params") or {}).get("remote_block_ids")
    ]
    assert len(moves) == 5 + 4  # D read P's blocks each turn; P read D's on turns 2-5
    assert all(revision[reader] == revision[source] for reader, source in moves), moves
    assert await w.reuse("hit") == 4
    assert w.fabric.violations == []


async def test_no_pair_of_one_revision_serves_the_turn_on_prefill_alone(world: Any) -> None:
    w = await world(prefill_spec={"revision": "new"}, decode_spec={"revision": "old"})
    await identified(w)
    status, body = await post(w, chat([{"role": "user", "content": "hello"}]))
    assert status == 200, body
    assert w.decode[0].calls == []
    assert await w.metric("boomerang_router_degraded_turns_total", missing="decode") == 1


async def test_a_prefill_of_another_vllm_release_never_hands_kv_to_decode(world: Any) -> None:
    """A 0.34 P beside a 0.32 D (engines that publish no revision, or a role's image
    overridden under one revision): the turn is served on P alone, D gets nothing."""
    w = await world(prefill_spec={"version": "0.34.0"}, decode_spec={"version": "0.32.0"})
    await identified(w)
    status, body = await post(w, chat([{"role": "user", "content": "hello"}]))
    assert status == 200, body
    assert w.decode[0].calls == []
    assert await w.metric("boomerang_router_degraded_turns_total", missing="decode") == 1


async def test_no_pair_and_no_fallback_is_a_clear_503(world: Any) -> None:
    w = await world(
        prefill_spec={"revision": "new"},
        decode_spec={"revision": "old"},
        single_engine_fallback=False,
    )
    await identified(w)
    status, body = await post(w, chat([{"role": "user", "content": "hello"}]))
    assert status == 503
    assert "one engine revision" in body["error"]["message"]
    assert w.prefill[0].calls == [] and w.decode[0].calls == []
