"""The local runtime runs what the operator renders, with only local things overridden."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from boomerang.connector import config
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
    assert spec.cmd[:4] == [python, "-m", "boomerang.connector.launch.entrypoint", "--"]
    args = list(spec.cmd[4:])
    rendered = render.engine_args(dd, role)
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == str(ports.http(role))
    if getattr(dd.spec, role).prefix_caching:  # a cache to report: its events on its own ports
        events = json.loads(args[args.index("--kv-events-config") + 1])
        assert events == config.kv_events_config(ports.http(role))
    else:
        assert "--kv-events-config" not in args
    # Everything but host, port and the ports derived from it is what the operator renders.
    strip = {"--host", "--port", "--kv-events-config"}

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


def with_replicas(dd, prefill: int, decode: int, router: int = 1):
    spec = dd.spec.model_copy(
        update={
            "prefill": dd.spec.prefill.model_copy(update={"replicas": prefill}),
            "decode": dd.spec.decode.model_copy(update={"replicas": decode}),
            "router": dd.spec.router.model_copy(update={"replicas": router}),
        }
    )
    return dd.model_copy(update={"spec": spec})


def test_every_replica_runs_with_its_own_ports_core_and_log(dd, tmp_path) -> None:
    two = with_replicas(dd, 2, 1)
    lines: list[str] = []
    replicas = stack.place(two, stack.LocalPorts(), [0, 1], lines.append)
    specs = [
        stack.engine_spec(
            two,
            r.role,
            engine_venv=tmp_path,
            ports=stack.LocalPorts(),
            run_dir=tmp_path,
            base_env={},
            index=r.index,
            cpu=r.cpu,
        )
        for r in replicas
    ]
    assert [s.name for s in specs] == ["prefill-0", "prefill-1", "decode-0"]
    assert [s.log.name for s in specs] == ["prefill-0.log", "prefill-1.log", "decode-0.log"]
    ports = [s.cmd[list(s.cmd).index("--port") + 1] for s in specs]
    assert ports == ["8100", "8101", "8200"]
    assert [s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in specs] == ["5600", "5601", "5700"]
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in specs] == ["0", "0", "1"]
    assert [s.env["BOOMERANG_KV_CPUS"] for s in specs] == ["0", "0", "1"]
    assert [s.health_url for s in specs] == [
        f"http://127.0.0.1:{port}/health" for port in ("8100", "8101", "8200")
    ]
    assert "Sharing cores: prefill-0, prefill-1 share core 0 (3 engines on 2 cores)" in lines


def test_the_router_is_given_every_replica(dd) -> None:
    cfg = stack.router_settings(with_replicas(dd, 2, 3), stack.LocalPorts())
    assert cfg["prefill"] == {"urls": ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]}
    assert cfg["decode"] == {
        "urls": ["http://127.0.0.1:8200", "http://127.0.0.1:8201", "http://127.0.0.1:8202"]
    }


def test_a_count_the_machine_cannot_run_is_refused_before_anything_starts(dd) -> None:
    with pytest.raises(ValueError, match="each decode engine needs a core of its own"):
        stack.place(with_replicas(dd, 1, 2), stack.LocalPorts(), [0, 1], print)
    with pytest.raises(ValueError, match="already taken by prefill-100"):
        stack.place(with_replicas(dd, 150, 1), stack.LocalPorts(), [0, 1], print)


def test_router_replicas_are_run_as_one_local_router_and_said_so(dd) -> None:
    lines: list[str] = []
    stack.place(with_replicas(dd, 1, 1, router=2), stack.LocalPorts(), [0, 1], lines.append)
    assert any("spec.router.replicas is 2: the local stack runs one router" in x for x in lines)
    quiet: list[str] = []
    stack.place(dd, stack.LocalPorts(), [0, 1], quiet.append)
    assert not any("router" in x for x in quiet)


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


def test_boomerang_up_refuses_decoders_sharing_a_core_before_installing_anything(
    tmp_path, monkeypatch, capsys
) -> None:
    import yaml

    from boomerang.local import cli

    data = yaml.safe_load(MANIFEST.read_text())
    data["spec"]["decode"]["replicas"] = 2
    manifest = tmp_path / "two-decoders.yaml"
    manifest.write_text(yaml.safe_dump(data))
    monkeypatch.setattr(stack.os, "sched_getaffinity", lambda _pid: {0, 1})

    def must_not_install() -> None:
        raise AssertionError("installed the engine venv for a manifest it refuses")

    monkeypatch.setattr(stack, "ensure_engine_venv", must_not_install)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["up", str(manifest)])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("boomerang: spec.decode.replicas is 2, but the local runtime may use 2")
