"""Active health: probe every engine's `/health`, learn its `/version`, readmit ejected ones.

Passive ejection happens in the flow (consecutive failed calls); this loop is what brings an
ejected engine back, marks engines ready for `/ready`, and reads each engine's version once
for capability detection. Probes run concurrently and are bounded by `timeouts.probe_s`.
"""

from __future__ import annotations

import asyncio
import logging

from boomerang.router.config import RouterConfig
from boomerang.router.endpoints import Endpoint, Pool
from boomerang.router.engine_http import EngineClient
from boomerang.router.metrics import Metrics
from boomerang.router.upstream import UpstreamError, get_json, timeout

log = logging.getLogger("boomerang.router")


async def probe(engines: EngineClient, pool: Pool, ep: Endpoint, config: RouterConfig) -> bool:
    """One probe of one engine; updates its state; returns whether it is healthy."""
    t = config.timeouts
    limit = timeout(t.probe_s, min(t.connect_s, t.probe_s))
    try:
        await get_json(engines, ep.url + "/health", limit)
    except UpstreamError as exc:
        was_ejected = ep.ejected
        pool.failed(ep)
        if ep.ejected and not was_ejected:
            log.warning("Ejected engine", extra={"role": pool.role, "engine": ep.url})
        log.debug("Probe failed", extra={"engine": ep.url, "error": str(exc)})
        return False
    was_ejected = ep.ejected
    pool.succeeded(ep, probe=True)
    if was_ejected and not ep.ejected:
        log.info("Readmitted engine", extra={"role": pool.role, "engine": ep.url})
    if ep.version is None:
        try:
            data = await get_json(engines, ep.url + "/version", limit)
            if isinstance(data, dict) and isinstance(data.get("version"), str):
                ep.version = data["version"]
        except UpstreamError:
            ep.version = None
    return True


async def probe_all(
    engines: EngineClient, pools: list[Pool], config: RouterConfig, metrics: Metrics
) -> None:
    """Probe every known engine once, concurrently, and refresh the endpoint gauges."""
    jobs = [probe(engines, pool, ep, config) for pool in pools for ep in pool.endpoints.values()]
    await asyncio.gather(*jobs)
    for pool in pools:
        eps = list(pool.endpoints.values())
        metrics.endpoints.labels(pool.role, "ready").set(sum(e.ready for e in eps))
        metrics.endpoints.labels(pool.role, "ejected").set(sum(e.ejected for e in eps))
        metrics.endpoints.labels(pool.role, "known").set(len(eps))


async def run_prober(
    engines: EngineClient, pools: list[Pool], config: RouterConfig, metrics: Metrics
) -> None:
    """Probe forever, every `health.probe_interval_s` (until cancelled)."""
    while True:
        try:
            await probe_all(engines, pools, config, metrics)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("Probe round failed")
        await asyncio.sleep(config.health.probe_interval_s)
