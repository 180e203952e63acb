"""The local runtime runs what the operator renders, with only local things overridden."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from boomerang.local import stack
from boomerang.operator import render

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "local-cpu.yaml"


@pytest.fixture(scope="module")
def dd():
    return stack.load_manifest(MANIFEST)


def kv_config(cmd: list[str]) -> dict:
    return json.loads(cmd[cmd.index("--kv-transfer-config") + 1])


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_engine_runs_the_rendered_args_with_local_host_and_port(dd, role, tmp_path) -> None:
    ports = stack.LocalPorts()
    spec = stack.engine_spec(
        dd, role, engine_venv=tmp_path / "venv", ports=ports, run_dir=tmp_path, base_env={}
    )
    python = str(tmp_path / "venv" / "bin" / "python")
    assert spec.cmd[:4] == [python, "-m", "boomerang.connector.entrypoint", "--"]
    args = list(spec.cmd[4:])
    rendered = render.engine_args(dd, role)
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == str(ports.http(role))
    # Everything but host and port is exactly what the operator puts in the pod.
    strip = {"--host", "--port"}

    def without(a: list[str]) -> list[str]:
        return [x for i, x in enumerate(a) if x not in strip and (i == 0 or a[i - 1] not in strip)]

    assert without(args) == without(rendered)
    assert kv_config(args)["kv_buffer_device"] == "cpu"
    assert spec.health_url == f"http://127.0.0.1:{ports.http(role)}/health"


def test_engines_get_distinct_side_channels_and_cores(dd, tmp_path) -> None:
    envs = {
        role: stack.engine_spec(
            dd, role, engine_venv=tmp_path, ports=stack.LocalPorts(), run_dir=tmp_path, base_env={}
        ).env
        for role in ("prefill", "decode")
    }
    for role, env in envs.items():
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the manifest's user env survives
        assert env["BOOMERANG_ROLE"] == role
    assert (
        envs["prefill"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]
        != envs["decode"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    )
    assert (
        envs["prefill"]["VLLM_CPU_OMP_THREADS_BIND"] != envs["decode"]["VLLM_CPU_OMP_THREADS_BIND"]
    )
    assert envs["prefill"]["BOOMERANG_KV_CPUS"] != envs["decode"]["BOOMERANG_KV_CPUS"]


def test_router_points_at_the_local_engines(dd) -> None:
    cfg = stack.router_settings(dd, stack.LocalPorts(router=9999))
    assert cfg["prefill"] == {"urls": ["http://127.0.0.1:8100"]}
    assert cfg["decode"] == {"urls": ["http://127.0.0.1:8200"]}
    assert (cfg["listen_host"], cfg["listen_port"]) == ("127.0.0.1", 9999)
    assert cfg["model"] == dd.spec.model.served_name


def test_a_file_that_is_not_a_deployment_is_refused(tmp_path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("kind: Pod\n")
    with pytest.raises(ValueError, match="DisaggregatedDeployment"):
        stack.load_manifest(bad)
