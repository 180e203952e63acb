"""Active health: probe every engine's `/health`, learn what it is, readmit ejected ones.

Passive ejection happens in the flow (consecutive failed calls); this loop is what brings an
ejected engine back, marks engines ready for `/ready`, and reads once what the router needs to
know about each engine: its `/version` (capability detection) and, for decode engines, the KV
block size from `/metrics` (vLLM's `vllm:cache_config_info` gauge carries it as a label), which
partial reuse needs and must never guess. Probes run concurrently and are bounded by
`timeouts.probe_s`.
"""

from __future__ import annotations

import asyncio
import logging
import re

from boomerang.router.config import RouterConfig
from boomerang.router.endpoints import Endpoint, Pool
from boomerang.router.engine_http import EngineClient, Limits
from boomerang.router.metrics import Metrics
from boomerang.router.upstream import UpstreamError, get_bytes, get_json, timeout

log = logging.getLogger("boomerang.router")
_CACHE_INFO = re.compile(rb"^vllm:cache_config_info\{(.*)\}", re.MULTILINE)
_BLOCK_SIZE = re.compile(rb'(?:^|,)\s*block_size="(\d+)"')


def block_size_from_metrics(text: bytes) -> int:
    """D's KV block size from a Prometheus page: the `block_size` label of
    `vllm:cache_config_info`; 0 when absent, malformed or ambiguous (several values)."""
    sizes = set()
    for labels in _CACHE_INFO.findall(text):
        match = _BLOCK_SIZE.search(labels)
        sizes.add(int(match.group(1)) if match else 0)
    return sizes.pop() if len(sizes) == 1 else 0


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
    if ep.block_size is None and pool.role == "decode":
        await _learn_block_size(engines, ep, limit)
    return True


async def _learn_block_size(engines: EngineClient, ep: Endpoint, limit: Limits) -> None:
    """Once per engine: a refused page (4xx) means the engine does not say (0, full hits only);
    a transport failure leaves it unknown, to ask again at the next probe."""
    try:
        ep.block_size = block_size_from_metrics(
            await get_bytes(engines, ep.url + "/metrics", limit)
        )
    except UpstreamError as exc:
        if exc.kind == "client":
            ep.block_size = 0
        return
    if ep.block_size:
        log.info("Learned block size", extra={"engine": ep.url, "block_size": ep.block_size})
    else:
        log.warning("Engine reports no block size: partial reuse off", extra={"engine": ep.url})


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
