"""The NIXL progress-thread fix: the delay setting, and the config class it substitutes."""

from __future__ import annotations

import sys
import types

import pytest

from boomerang.connector.plugin import nixl_quiet


def test_delay_defaults_to_one_millisecond_and_zero_disables() -> None:
    assert nixl_quiet.progress_delay_us({}) == nixl_quiet.DEFAULT_DELAY_US == 10_000
    assert nixl_quiet.progress_delay_us({nixl_quiet.ENV_DELAY: "0"}) == 0


@pytest.mark.parametrize("raw", ["soon", "-5"])
def test_bad_delay_is_refused_clearly(raw: str) -> None:
    with pytest.raises(ValueError, match=nixl_quiet.ENV_DELAY):
        nixl_quiet.progress_delay_us({nixl_quiet.ENV_DELAY: raw})


class FakeAgentConfig:
    """Stands in for the pybind nixlAgentConfig: a plain attribute NIXL's API sets to 0."""

    def __init__(self) -> None:
        self._delay = 0

    @property
    def pthrDelay(self) -> int:
        return self._delay

    @pthrDelay.setter
    def pthrDelay(self, value: int) -> None:
        self._delay = value


def test_patched_api_never_lets_the_delay_go_below_the_setting(monkeypatch) -> None:
    bindings = types.SimpleNamespace(nixlAgentConfig=FakeAgentConfig, DRAM_SEG=7)
    api = types.ModuleType("nixl._api")
    api.nixlBind = bindings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nixl", types.ModuleType("nixl"))
    monkeypatch.setitem(sys.modules, "nixl._api", api)
    assert nixl_quiet.apply({nixl_quiet.ENV_DELAY: "2500"})
    cfg = api.nixlBind.nixlAgentConfig()  # type: ignore[attr-defined]
    cfg.pthrDelay = 0  # what nixl_agent.__init__ does
    assert cfg.pthrDelay == 2500
    cfg.pthrDelay = 10_000
    assert cfg.pthrDelay == 10_000
    assert api.nixlBind.DRAM_SEG == 7  # type: ignore[attr-defined]
    assert nixl_quiet.apply({})  # idempotent: no double wrapping
    assert api.nixlBind.nixlAgentConfig().__class__.__mro__[1] is FakeAgentConfig  # type: ignore[attr-defined]


def test_disabled_fix_leaves_nixl_alone(monkeypatch) -> None:
    api = types.ModuleType("nixl._api")
    api.nixlBind = types.SimpleNamespace(nixlAgentConfig=FakeAgentConfig)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nixl._api", api)
    assert not nixl_quiet.apply({nixl_quiet.ENV_DELAY: "0"})
    assert api.nixlBind.nixlAgentConfig is FakeAgentConfig  # type: ignore[attr-defined]
