"""P/D pairing by engine revision: while a rollout runs two, a turn's P and D share one."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from boomerang.connector.config import ENGINE_REVISION_METRIC
from boomerang.router.endpoints import Endpoint, Pool, compatible, pairable, partners
from boomerang.router.health import revision_from_metrics


def ep(url: str, role: str, revision: str | None) -> Endpoint:
    return Endpoint(url, role, revision=revision)  # type: ignore[arg-type]


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


def test_an_ejected_engine_is_identified_again_when_it_comes_back() -> None:
    pool = Pool("decode", eject_after=1)
    d = ep("d0", "decode", "old")
    d.identified = True
    pool.endpoints = {"d0": d}
    assert pool.failed(d)
    assert not d.identified  # it may come back as another build
