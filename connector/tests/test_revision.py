"""The engine publishes its revision on /metrics, from the env the operator sets."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest

from boomerang.connector.plugin import revision
from boomerang.facts.engine import ENGINE_REVISION_ENV, ENGINE_REVISION_METRIC


def test_no_revision_is_published_without_the_env() -> None:
    assert revision.publish({}) is None
    assert revision.publish({ENGINE_REVISION_ENV: "  "}) is None


def test_the_revision_is_published_once_as_a_gauge_on_the_default_registry() -> None:
    env = {ENGINE_REVISION_ENV: "0a1b2c3d"}
    assert revision.publish(env) == "0a1b2c3d"
    assert revision.publish(env) == "0a1b2c3d"  # vLLM may call the plugin again: no duplicate
    text = generate_latest(REGISTRY).decode()
    assert f'{ENGINE_REVISION_METRIC}{{revision="0a1b2c3d"}} 1.0' in text
