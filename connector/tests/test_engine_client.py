"""Prometheus pages are read with prometheus_client's own parser: what the demo, the
benchmarks and the data-plane tests count from an engine's or the router's `/metrics`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from boomerang.local import demo
from boomerang.local.engine_client import samples, tokens_by_source, totals

VLLM_PAGE = """# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"} 96.0
vllm:prompt_tokens_by_source_total{engine="1",source="external_kv_transfer"} 32.0
vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 7.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto"} 1.0
"""


def test_an_engines_token_sources_are_summed_over_its_label_sets() -> None:
    assert tokens_by_source(VLLM_PAGE) == {"external_kv_transfer": 128.0, "local_compute": 7.0}
    [info] = samples(VLLM_PAGE, "vllm:cache_config_info")
    assert info.labels["block_size"] == "16"


def test_the_routers_own_exposition_reads_back() -> None:
    """The page prometheus_client writes for the router's counters and histograms."""
    registry = CollectorRegistry()
    reuse = Counter("boomerang_router_reuse", "Reuse.", ["outcome"], registry=registry)
    reuse.labels("hit").inc(2)
    reuse.labels("miss").inc()
    ttft = Histogram("boomerang_router_ttft_seconds", "TTFT.", ["reuse"], registry=registry)
    ttft.labels("hit").observe(0.25)
    ttft.labels("miss").observe(0.5)
    page = generate_latest(registry).decode()
    assert demo.reuse_counts(page) == {"hit": 2.0, "miss": 1.0}
    assert totals(page, "boomerang_router_ttft_seconds_sum", "reuse") == {"hit": 0.25, "miss": 0.5}
    assert samples(page, "boomerang_router_reuse") == []  # a sample's own name, not its family's
