"""The plugin says on /metrics which of its engine-side changes are in force."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest

from boomerang.connector.plugin import capability
from boomerang.facts.engine import CONTINUE_CAPABILITY, ENGINE_CAPABILITY_METRIC


def test_a_capability_is_a_gauge_on_the_default_registry_once() -> None:
    assert capability.publish(CONTINUE_CAPABILITY)
    assert capability.publish(CONTINUE_CAPABILITY)  # vLLM may call the plugin again
    text = generate_latest(REGISTRY).decode()
    assert f'{ENGINE_CAPABILITY_METRIC}{{capability="continue"}} 1.0' in text
    assert text.count(f"# TYPE {ENGINE_CAPABILITY_METRIC} gauge") == 1
