"""Active health: probe every engine's `/health`, learn what it is, readmit ejected ones.

Passive ejection happens in the flow (consecutive failed calls); this loop is what brings an
ejected engine back, marks engines ready for `/ready`, and reads once what the router needs to
know about each engine: its `/version` (capability detection), from `/metrics` the engine
revision the Boomerang plugin publishes (P and D are paired within one revision) and, for
decode engines, the KV block size (vLLM's `vllm:cache_config_info` gauge carries it as a
label), which partial reuse needs and must never guess, and the KV cache size in blocks (its
`num_gpu_blocks` label: the decode-memory budget of retention is a fraction of it). Probes
run concurrently and are bounded by `timeouts.probe_s`.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client.parser import text_string_to_metric_families

from boomerang.facts.engine import ENGINE_CAPABILITY_METRIC, ENGINE_REVISION_METRIC
from boomerang.router.config import RouterConfig
from boomerang.router.engines.endpoints import Endpoint, Pool
from boomerang.router.engines.upstream import (
    EngineClient,
    Limits,
    UpstreamError,
    get_bytes,
    get_json,
    timeout,
)
from boomerang.router.metrics import Metrics

log = logging.getLogger("boomerang.router")
CACHE_INFO = "vllm:cache_config_info"


def _cache_labels(text: bytes, label: str) -> set[int] | None:
    """The integer values of `label` on `vllm:cache_config_info` (0 for a malformed one); None
    when the page does not parse."""
    values = set()
    try:
        for family in text_string_to_metric_families(text.decode(errors="replace")):
            for sample in family.samples:
                if sample.name == CACHE_INFO:
                    value = sample.labels.get(label, "")
                    values.add(int(value) if value.isascii() and value.isdigit() else 0)
    except ValueError:
        return None
    return values


def block_size_from_metrics(text: bytes) -> int:
    """D's KV block size from a Prometheus page (read with prometheus_client's parser): the
    `block_size` label of `vllm:cache_config_info`; 0 when absent, malformed or ambiguous
    (several values), or when the page does not parse."""
    sizes = _cache_labels(text, "block_size")
    return sizes.pop() if sizes is not None and len(sizes) == 1 else 0


def kv_blocks_from_metrics(text: bytes) -> int:
    """D's KV cache size in blocks: the `num_gpu_blocks` label of the same gauge (vLLM sets it
    once the cache is allocated); the smallest of several engines' (data parallel: a request
    lands on one); 0 when absent or unparsable (then no decode-memory budget applies)."""
    counts = _cache_labels(text, "num_gpu_blocks")
    return min(counts) if counts and 0 not in counts else 0


def capabilities_from_metrics(text: bytes) -> frozenset[str]:
    """The engine-side changes Boomerang's plugin says are in force (the `capability` labels
    of `boomerang_engine_capability_info` at 1); none when absent or unparsable."""
    found = _set_labels(text, ENGINE_CAPABILITY_METRIC, "capability")
    return frozenset() if found is None else frozenset(found - {""})


def revision_from_metrics(text: bytes) -> str | None:
    """The engine revision the Boomerang plugin publishes (the `revision` label of
    `boomerang_engine_revision_info`); None when absent, ambiguous or unparsable."""
    found = _set_labels(text, ENGINE_REVISION_METRIC, "revision")
    if found is None or len(found) != 1:
        return None
    return found.pop() or None


def histogram_totals(text: bytes, metric: str) -> tuple[float, float] | None:
    """The `_sum` and `_count` of histogram `metric` added over its label sets (an engine per
    data-parallel rank); None when the page has neither or does not parse."""
    totals = {"_sum": 0.0, "_count": 0.0}
    seen = False
    try:
        for family in text_string_to_metric_families(text.decode(errors="replace")):
            for sample in family.samples:
                suffix = sample.name.removeprefix(metric)
                if suffix in totals and sample.name != suffix:
                    totals[suffix] += sample.value
                    seen = True
    except ValueError:
        return None
    return (totals["_sum"], totals["_count"]) if seen else None


def _set_labels(text: bytes, metric: str, label: str) -> set[str] | None:
    """The `label` values of `metric`'s samples that are set (non-zero), as the plugin's
    info gauges publish them; None when the page does not parse."""
    found = set()
    try:
        for family in text_string_to_metric_families(text.decode(errors="replace")):
            for sample in family.samples:
                if sample.name == metric and sample.value:
                    found.add(sample.labels.get(label, ""))
    except ValueError:
        return None
    return found


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
    needs_block = ep.block_size is None  # D's for its handles, P's for what it forgets
    if needs_block or not ep.identified:
        await _read_metrics(engines, ep, limit, needs_block)
    return True


async def _read_metrics(engines: EngineClient, ep: Endpoint, limit: Limits, block: bool) -> None:
    """Once per engine (again after an ejection): its revision and the plugin's capabilities,
    its block size and KV size (D's handles use the first, `forgetting.py` both). A refused
    page (4xx) means the engine does not say (no revision, no capability; block size 0, full
    hits only); a transport failure leaves them unknown, to ask again at the next probe."""
    try:
        page = await get_bytes(engines, ep.url + "/metrics", limit)
    except UpstreamError as exc:
        if exc.kind == "client":
            ep.identified = True
            ep.block_size = 0 if block else ep.block_size
            ep.capabilities = frozenset()
        return
    ep.identified = True
    ep.revision = revision_from_metrics(page)
    ep.capabilities = capabilities_from_metrics(page)
    if ep.revision:
        log.info("Learned engine revision", extra={"engine": ep.url, "revision": ep.revision})
    if ep.capabilities:
        log.info(
            "Learned engine capabilities", extra={"engine": ep.url, "has": sorted(ep.capabilities)}
        )
    if not block:
        return
    ep.block_size = block_size_from_metrics(page)
    ep.kv_blocks = kv_blocks_from_metrics(page)
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
