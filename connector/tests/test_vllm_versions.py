"""Each vLLM release the project supports has every internal Boomerang's plugin patches or calls,
as the plugin assumes it, read from that release's own wheel.

The wheels are vLLM's GPU builds from PyPI (`pip download --no-deps`, cached under
`$BOOMERANG_CACHE/vllm-wheels/<version>/`); importing them needs CUDA, so their sources are read
with `ast` (`vllm_source_testing`). Checked per release: every point of `vllm_points` that
release needs (the stream generators only before 0.33; from 0.33 the places where vLLM streams
D's params itself), every engine argument `config.engine_args` renders is a field of vLLM's
argument classes, and every key of the kv-transfer configuration `config.kv_transfer_config`
renders is one vLLM reads. Under CI a failed download fails; elsewhere it skips.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from vllm_source_testing import WheelSource, download

from boomerang.connector import config
from boomerang.connector.plugin import vllm_points
from boomerang.facts.engine import STREAMS_PARAMS_SINCE

pytestmark = [pytest.mark.wheels, pytest.mark.timeout(1800)]
NIXL_PACKAGE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"


def wheel_cache() -> Path:
    base = os.environ.get("BOOMERANG_CACHE") or str(Path.home() / ".cache" / "boomerang")
    return Path(base) / "vllm-wheels"


@pytest.fixture(scope="module", params=vllm_points.SUPPORTED_VLLM)
def release(request: pytest.FixtureRequest) -> tuple[str, WheelSource]:
    version: str = request.param
    try:
        wheel = download(version, wheel_cache())
    except (subprocess.CalledProcessError, IndexError) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM {version}'s wheel could not be downloaded: {exc}")
        pytest.skip(f"vLLM {version}'s wheel could not be downloaded: {exc}")
    return version, WheelSource(wheel)


def test_every_internal_the_plugin_needs_is_there_as_it_assumes(
    release: tuple[str, WheelSource],
) -> None:
    version, source = release
    points = vllm_points.needed(version)
    assert len(points) >= 15
    problems = {p.describe(): why for p in points if (why := source.check(p)) is not None}
    assert problems == {}, f"vLLM {version}"


def test_the_stream_patch_applies_before_0_33_and_steps_aside_from_it(
    release: tuple[str, WheelSource],
) -> None:
    version, _ = release
    names = {(p.path, p.used_by) for p in vllm_points.needed(version)}
    streams = {(p.path, p.used_by) for p in vllm_points.STREAMS}
    passes = [p for p in vllm_points.needed(version) if p.passes]
    if vllm_points.version_tuple(version) < STREAMS_PARAMS_SINCE:
        assert streams <= names and not passes
    else:
        # vLLM's own stream code passes kv_transfer_params (checked above as points); the
        # plugin's wrappers are not needed.
        assert not streams & names and len(passes) == 2


def engine_flags() -> set[str]:
    """Every flag `config.engine_args` can render, each option switched on."""
    engine = config.EngineSettings(
        model="m", served_model_name="s", max_model_len=64, enforce_eager=True
    )
    args = config.engine_args("decode", engine, config.KVTransferSettings())
    args += config.engine_args(
        "prefill", config.EngineSettings(model="m", served_model_name="s", prefix_caching=False),
        config.KVTransferSettings(),
    )  # fmt: skip
    return {a for a in args if a.startswith("--")}


def test_every_engine_argument_config_renders_is_one_vllm_declares(
    release: tuple[str, WheelSource],
) -> None:
    version, source = release
    engine_args = source.find("vllm.engine.arg_utils", "EngineArgs")
    assert engine_args is not None
    declared = source.fields(engine_args)
    for frontend in source.classes_named("FrontendArgs"):
        declared |= source.fields(frontend)
    flags = engine_flags()
    assert {"--middleware", "--worker-extension-cls", "--kv-transfer-config"} <= flags
    fields = {f.removeprefix("--").removeprefix("no-").replace("-", "_") for f in flags}
    assert fields - declared == set(), f"vLLM {version}"


def test_every_kv_transfer_setting_config_renders_is_one_vllm_reads(
    release: tuple[str, WheelSource],
) -> None:
    version, source = release
    rendered = config.kv_transfer_config("decode", config.KVTransferSettings())
    kv_config = source.find("vllm.config.kv_transfer", "KVTransferConfig")
    assert kv_config is not None
    assert set(rendered) - source.fields(kv_config) == set(), f"vLLM {version}"
    extra = rendered["kv_connector_extra_config"]
    assert isinstance(extra, dict)
    assert set(extra) - source.extra_config_keys(NIXL_PACKAGE) == set(), f"vLLM {version}"
