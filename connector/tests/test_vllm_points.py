"""The patch-point list and its two readers, on stand-ins: the plugin's start-up check (by
import) and the per-version test's reader of a wheel's sources (by `ast`) find the same faults,
and the plugin refuses a vLLM it cannot patch in one log line with its capabilities at 0.

The real releases are checked in `test_vllm_versions.py` (their wheels) and, for the CPU build
the engines run, in `test_plugin_on_engine.py`."""

from __future__ import annotations

import logging
import sys
import types
import zipfile
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from vllm_source_testing import WheelSource

from boomerang.connector.plugin import register as plugin
from boomerang.connector.plugin import vllm_points
from boomerang.connector.plugin.vllm_points import Point
from boomerang.facts.engine import ENGINE_CAPABILITY_METRIC

SOURCE = """
import functools


def traced(init):
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        return init(self, *args, **kwargs)

    return wrapper


class Traced:
    @traced
    def __init__(self):
        self.input_queue = None


class Base:
    def __init__(self):
        self._kept: set = set()


class Sched(Base):
    def __init__(self):
        super().__init__()
        self.other = 1

    def finished(self, request, block_ids):
        return False, None

    @classmethod
    def topology(cls):
        return [[0]]

    async def stream(self, request, extra, result_generator):
        yield call(kv_transfer_params=None)


Alias = Sched
GROUP = "vllm.general_plugins"
"""
POINTS = (
    Point("fake.mod", "Sched", "t", attributes=("_kept", "other")),
    Point("fake.mod", "Traced", "t", attributes=("input_queue",)),  # through the decorator
    Point("fake.mod", "Alias.finished", "t", params=("self", "request", "block_ids"), exact=True),
    Point("fake.mod", "Sched.topology", "t", params=("cls",), exact=True),
    Point("fake.mod", "Sched.stream", "t", params=("self", "result_generator"),
          async_generator=True),
    Point("fake.mod", "GROUP", "t", value="vllm.general_plugins"),
)  # fmt: skip
BROKEN = {
    Point("fake.mod", "Sched", "t", attributes=("_gone",)): "__init__ sets no _gone",
    Point("fake.mod", "Sched.finished", "t", params=("self", "request"), exact=True): (
        "takes (self, request, block_ids)"
    ),
    Point("fake.mod", "Sched.stream", "t", params=("self", "missing")): (
        "takes (self, request, extra, result_generator)"
    ),
    Point("fake.mod", "Sched.finished", "t", async_generator=True): "not an async generator",
    Point("fake.mod", "Sched.gone", "t"): "absent",
    Point("fake.mod", "GROUP", "t", value="other"): "is 'vllm.general_plugins', not 'other'",
}


def fake_wheel(tmp_path: Path) -> WheelSource:
    wheel = tmp_path / "fake-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake/__init__.py", "")
        z.writestr("fake/mod.py", SOURCE)
    return WheelSource(wheel)


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> None:
    package, module = types.ModuleType("fake"), types.ModuleType("fake.mod")
    module.__dict__["call"] = dict
    exec(compile(SOURCE, "fake/mod.py", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "fake", package)
    monkeypatch.setitem(sys.modules, "fake.mod", module)


def test_both_readers_accept_what_is_there(tmp_path: Path, fake_module: None) -> None:
    source = fake_wheel(tmp_path)
    for point in POINTS:
        assert source.check(point) is None, point
        assert vllm_points.check(point) is None, point


def test_both_readers_name_the_same_fault(tmp_path: Path, fake_module: None) -> None:
    source = fake_wheel(tmp_path)
    for point, why in BROKEN.items():
        assert source.check(point) == why, point
        assert vllm_points.check(point) == why, point


def test_the_source_reader_follows_passed_keywords(tmp_path: Path) -> None:
    source = fake_wheel(tmp_path)
    assert (
        source.check(Point("fake.mod", "Sched.stream", "t", passes=("kv_transfer_params",))) is None
    )
    assert source.check(Point("fake.mod", "Sched.stream", "t", passes=("nope",))) == (
        "passes no nope="
    )


def test_a_point_is_needed_only_in_its_versions() -> None:
    streams = set(vllm_points.STREAMS)
    assert streams <= set(vllm_points.needed("0.32.0"))
    assert streams <= set(vllm_points.needed("0.32.1+cpu"))
    assert not streams & set(vllm_points.needed("0.33.0"))
    assert vllm_points.supported("0.34.0") and not vllm_points.supported("0.35.0")
    assert vllm_points.version_tuple("0.33.1rc2+cu130") == (0, 33)


def test_the_plugin_refuses_a_vllm_it_cannot_patch_in_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A vLLM whose internals moved (here: a `vllm` package with none of them): no patch, one
    error line naming the version and what is missing, every capability at 0."""
    fake = types.ModuleType("vllm")
    fake.__dict__["__version__"] = "0.35.0"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(plugin, "_said", set())
    with caplog.at_level(logging.DEBUG, logger=plugin.logger.name):
        plugin.register()
        plugin.register()  # vLLM may load its plugins twice: still one line
    lines = [r for r in caplog.records if r.name == plugin.logger.name]
    errors = [r.getMessage() for r in lines if r.levelno >= logging.WARNING]
    assert len(errors) == 1, errors
    assert "vLLM 0.35.0 cannot be patched" in errors[0]
    assert "OpenAIServingChat.chat_completion_stream_generator_raw" not in errors[0]
    assert "NixlPullConnectorScheduler.request_finished(self, request, block_ids)" in errors[0]
    assert "\n" not in errors[0]
    page = generate_latest(REGISTRY).decode()
    assert f'{ENGINE_CAPABILITY_METRIC}{{capability="continue"}} 0.0' in page
