"""The one failover policy every engine call uses: another engine after a retryable failure,
the engine's 4xx straight to the client, and a clear 5xx when no engine is left."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from boomerang.router.engines.endpoints import Endpoint, Pool
from boomerang.router.engines.failover import Failover, Unavailable
from boomerang.router.engines.upstream import UpstreamError
from boomerang.router.errors import ApiError
from boomerang.router.metrics import Metrics

URLS = ["http://e0", "http://e1", "http://e2"]


def pool() -> Pool:
    p = Pool("decode", eject_after=1)
    p.set_urls(URLS)
    return p


def first_of(candidates: Sequence[Endpoint]) -> Endpoint:
    return candidates[0]


class Engines:
    """Answers per URL: an UpstreamError to raise, or the value to return."""

    def __init__(self, answers: dict[str, UpstreamError | str]) -> None:
        self.answers = answers
        self.called: list[str] = []

    async def __call__(self, ep: Endpoint) -> str:
        self.called.append(ep.url)
        answer = self.answers.get(ep.url, "ok")
        if isinstance(answer, UpstreamError):
            raise answer
        return answer


def retries(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("boomerang_router_retries_total", {"role": "decode"})
    return value or 0.0


async def test_a_retryable_failure_moves_on_to_an_engine_not_tried() -> None:
    metrics, p = Metrics(), pool()
    engines = Engines({URLS[0]: UpstreamError("status", "500", status=500)})
    assert await Failover(metrics).run(p, first_of, engines, retries=2) == "ok"
    assert engines.called == URLS[:2]
    assert retries(metrics) == 1
    assert p.endpoints[URLS[0]].ejected  # eject_after=1


async def test_the_first_engine_is_the_one_given() -> None:
    engines = Engines({})
    given = pool().endpoints[URLS[2]]
    await Failover(Metrics()).run(pool(), first_of, engines, retries=2, first=given)
    assert engines.called == [URLS[2]]


async def test_a_4xx_goes_to_the_client_with_the_engines_message() -> None:
    body = b'{"error": {"message": "prompt too long"}}'
    engines = Engines({URLS[0]: UpstreamError("client", "400", status=400, body=body)})
    with pytest.raises(ApiError) as err:
        await Failover(Metrics()).run(pool(), first_of, engines, retries=2)
    assert (err.value.status, err.value.message) == (400, "prompt too long")
    assert engines.called == URLS[:1]


@pytest.mark.parametrize(
    ("kind", "status"), [("timeout", 504), ("status", 502), ("protocol", 502), ("connect", 502)]
)
async def test_no_engine_left_is_unavailable(kind: str, status: int) -> None:
    engines = Engines(dict.fromkeys(URLS, UpstreamError(kind, kind)))  # type: ignore[arg-type]
    with pytest.raises(Unavailable) as err:
        await Failover(Metrics()).run(pool(), first_of, engines, retries=5)
    assert (err.value.role, err.value.status) == ("decode", status)
    assert err.value.message == f"no decode engine could serve the request: {kind}"
    assert engines.called == URLS  # each engine once


async def test_no_engine_at_all_is_a_503() -> None:
    with pytest.raises(Unavailable) as err:
        await Failover(Metrics()).run(Pool("prefill"), first_of, Engines({}), retries=2)
    assert (err.value.role, err.value.status) == ("prefill", 503)


async def test_retries_are_bounded() -> None:
    engines = Engines(dict.fromkeys(URLS, UpstreamError("status", "500")))
    with pytest.raises(Unavailable):
        await Failover(Metrics()).run(pool(), first_of, engines, retries=1)
    assert engines.called == URLS[:2]


async def test_before_retry_sees_the_last_failure_and_only_before_a_retry() -> None:
    failures = [UpstreamError("connect", "refused"), UpstreamError("status", "500")]
    engines = Engines(dict(zip(URLS, failures, strict=False)))
    seen: list[UpstreamError] = []

    async def before_retry(failure: UpstreamError) -> None:
        seen.append(failure)

    run = Failover(Metrics()).run
    assert await run(pool(), first_of, engines, retries=2, before_retry=before_retry) == "ok"
    assert seen == failures
    seen.clear()
    only_one = Pool("decode")
    only_one.set_urls(URLS[:1])
    with pytest.raises(Unavailable):
        await run(only_one, first_of, engines, retries=2, before_retry=before_retry)
    assert seen == []  # no engine to retry on: nothing to prepare


def request_caused(metrics: Metrics) -> float:
    name = "boomerang_router_request_caused_failures_total"
    return metrics.registry.get_sample_value(name, {"role": "decode"}) or 0.0


async def test_a_5xx_from_every_engine_is_the_requests_and_ejects_none() -> None:
    """One client's request that makes every engine answer 500 (an input vLLM fails on) must
    not eject an engine: ejection voids every tenant's handles on it."""
    metrics, p = Metrics(), pool()
    engines = Engines(dict.fromkeys(URLS, UpstreamError("status", "500", status=500)))
    for _ in range(3):
        with pytest.raises(Unavailable):
            await Failover(metrics).run(p, first_of, engines, retries=5)
    assert not any(ep.ejected or ep.failures for ep in p.endpoints.values())
    assert request_caused(metrics) == 9
    name = "boomerang_router_upstream_failures_total"
    assert metrics.registry.get_sample_value(name, {"role": "decode", "kind": "status"}) is None


async def test_one_engine_answering_5xx_alone_is_not_ejected_by_requests() -> None:
    """With no other engine to tell, a 5xx is not held against the engine (its health probe
    ejects an engine that is down); a refused connection still counts at once."""
    metrics, p = Metrics(), Pool("decode", eject_after=1)
    p.set_urls(URLS[:1])
    with pytest.raises(Unavailable):
        await Failover(metrics).run(
            p, first_of, Engines({URLS[0]: UpstreamError("status", "500")}), retries=2
        )
    assert not p.endpoints[URLS[0]].ejected
    with pytest.raises(Unavailable):
        await Failover(metrics).run(
            p, first_of, Engines({URLS[0]: UpstreamError("connect", "refused")}), retries=2
        )
    assert p.endpoints[URLS[0]].ejected


async def test_a_5xx_counts_against_its_engine_once_another_served_the_call() -> None:
    metrics, p = Metrics(), Pool("decode", eject_after=2)
    p.set_urls(URLS)
    engines = Engines(
        {URLS[0]: UpstreamError("status", "500"), URLS[1]: UpstreamError("status", "500")}
    )
    assert await Failover(metrics).run(p, first_of, engines, retries=5) == "ok"
    assert [p.endpoints[u].failures for u in URLS] == [1, 1, 0]
    assert request_caused(metrics) == 0
