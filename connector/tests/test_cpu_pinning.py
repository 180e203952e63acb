"""Which core the KV-transfer thread of an engine is pinned to."""

from __future__ import annotations

import pytest

from boomerang.connector.plugin.cpu_pinning import ENV_KV_CPUS, kv_cpus


def test_unset_keeps_vllms_own_choice() -> None:
    assert kv_cpus({}) is None
    assert kv_cpus({ENV_KV_CPUS: " "}) is None


def test_core_lists_are_parsed() -> None:
    assert kv_cpus({ENV_KV_CPUS: "1"}) == [1]
    assert kv_cpus({ENV_KV_CPUS: "2,3"}) == [2, 3]


@pytest.mark.parametrize("raw", ["one", "-1", ",", "1;2"])
def test_bad_core_lists_are_refused_clearly(raw: str) -> None:
    with pytest.raises(ValueError, match=ENV_KV_CPUS):
        kv_cpus({ENV_KV_CPUS: raw})
