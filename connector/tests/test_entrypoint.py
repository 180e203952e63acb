"""The engine entrypoint's decisions: model URIs, side-channel host, EFA env, the command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from boomerang.connector import config
from boomerang.connector.launch import model
from boomerang.connector.launch.entrypoint import (
    UsageError,
    build_command,
    hub_template,
    resolve_model,
    termination_message,
)

KV = json.dumps(config.kv_transfer_config("prefill", config.KVTransferSettings()))


def test_hf_uri_becomes_the_hub_id() -> None:
    assert resolve_model("hf://Qwen/Qwen3-0.6B", {}) == ("Qwen/Qwen3-0.6B", [])


def test_pvc_uri_becomes_the_mount_path() -> None:
    assert resolve_model("pvc://models/qwen/32b", {}) == ("/models/qwen/32b", [])
    assert resolve_model("pvc://models", {}) == ("/models", [])


def test_s3_uri_streams_with_runai() -> None:
    assert resolve_model("s3://bucket/m", {}) == (
        "s3://bucket/m",
        ["--load-format", "runai_streamer"],
    )


def test_builtin_uri_lives_in_the_cache(tmp_path) -> None:
    path, extra = resolve_model("builtin://tiny", {"BOOMERANG_CACHE": str(tmp_path)})
    assert path == str(tmp_path / "models" / f"tiny-v{model.BUILD_VERSION}") and extra == []


@pytest.mark.parametrize(
    "uri", ["hf://justone", "hf://Qwen/Qwen 3", "pvc:///x", "ftp://x/y", "builtin://huge"]
)
def test_bad_model_uris_are_refused_with_the_allowed_shapes(uri: str) -> None:
    with pytest.raises(UsageError, match=r"is none of hf://org/name, s3://bucket/path"):
        resolve_model(uri, {})


def test_the_builtin_models_the_api_admits_are_the_ones_built() -> None:
    assert sorted(config.BUILTIN_MODELS) == sorted(model.SPECS)


@pytest.mark.parametrize(
    "uri",
    [
        "hf://Qwen/Qwen3-0.6B",
        "hf://meta-llama/Llama-3.1-8B-Instruct",
        "hf://deepseek-ai/DeepSeek_V3.1",
        "s3://my-bucket/models/qwen3-32b",
        "s3://Legacy_Bucket",
        "pvc://models",
        "pvc://model-cache.team-a/qwen/32b/",
        "builtin://tiny",
        "builtin://small",
    ],
)
def test_every_shape_the_api_admits_resolves(uri: str, tmp_path) -> None:
    assert config.model_source_error(uri) is None
    resolve_model(uri, {"BOOMERANG_CACHE": str(tmp_path)})


def test_command_runs_the_openai_server_module_with_the_resolved_model() -> None:
    cmd, _env = build_command(["--", "--model", "hf://org/m", "--kv-transfer-config", KV], {}, "py")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[3:5] == ["--model", "org/m"]
    assert cmd[-1] == KV


def test_equals_form_of_model_is_resolved_too() -> None:
    cmd, _ = build_command(["--model=pvc://c/p", "--port", "1"], {}, "py")
    assert cmd[3:] == ["--model", "/models/p", "--port", "1"]


def test_s3_adds_load_format_unless_given() -> None:
    cmd, _ = build_command(["--model", "s3://bucket/m"], {}, "py")
    assert cmd[-2:] == ["--load-format", "runai_streamer"]
    cmd, _ = build_command(["--model", "s3://bucket/m", "--load-format", "auto"], {}, "py")
    assert cmd.count("--load-format") == 1 and cmd[-1] == "auto"


def test_missing_model_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--model"):
        build_command(["--port", "8000"], {})


def test_side_channel_host_defaults_to_the_pod_ip() -> None:
    _, env = build_command(["--model", "m"], {"POD_IP": "10.1.2.3"})
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.2.3"


def test_explicit_side_channel_host_wins_over_the_pod_ip() -> None:
    env_in = {"POD_IP": "10.1.2.3", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}
    _, env = build_command(["--model", "m"], env_in)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"


def test_efa_with_libfabric_sets_the_efa_provider() -> None:
    """The configuration builder sets libfabric's EFA provider; the entrypoint passes the
    environment it is given on, and adds none of it itself."""
    kv = config.KVTransferSettings(backend="LIBFABRIC")
    args = [
        "--model",
        "m",
        "--kv-transfer-config",
        json.dumps(config.kv_transfer_config("decode", kv)),
    ]
    _, env = build_command(args, config.engine_env("decode", kv, efa=True))
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["FI_EFA_FORK_SAFE"] == "1"
    assert env["FI_EFA_ENABLE_SHM_TRANSFER"] == "0"  # shm needs CMA, which seccomp may refuse
    _, env = build_command(args, {})
    assert "FI_PROVIDER" not in env
    assert config.engine_env("decode", kv)["FI_PROVIDER"] == "tcp"


def test_bad_role_is_refused() -> None:
    with pytest.raises(UsageError, match="BOOMERANG_ROLE"):
        build_command(["--model", "m"], {"BOOMERANG_ROLE": "both"})


def test_operator_rendered_args_round_trip_through_the_entrypoint() -> None:
    engine = config.EngineSettings(model="hf://org/m", served_model_name="m", enforce_eager=True)
    args = config.engine_args("decode", engine, config.KVTransferSettings())
    cmd, _ = build_command(["--", *args], {}, "py")
    assert cmd[3:] == ["--model", "org/m", *args[2:]]


def test_sigterm_is_forwarded_to_the_server_which_drains(tmp_path) -> None:
    # A stand-in server that, like vLLM's, finishes its in-flight work on SIGTERM then exits 0.
    server = tmp_path / "server.py"
    server.write_text(
        textwrap.dedent("""
        import signal, sys, time
        def drain(*_):
            time.sleep(0.5); print("drained", flush=True); sys.exit(0)
        signal.signal(signal.SIGTERM, drain)
        print("ready", flush=True)
        while True: time.sleep(0.1)
    """)
    )
    runner = tmp_path / "runner.py"
    runner.write_text(
        textwrap.dedent(f"""
        import sys
        from boomerang.connector.launch.entrypoint import run
        sys.exit(run([sys.executable, {str(server)!r}], {{}}))
    """)
    )
    proc = subprocess.Popen([sys.executable, str(runner)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert proc.stdout.read().strip() == "drained"


def test_a_template_file_in_a_local_model_becomes_its_path(tmp_path) -> None:
    env = {"BOOMERANG_CACHE": str(tmp_path)}
    argv = ["--model", "builtin://tiny", "--chat-template", "model://chat_template.jinja"]
    cmd, _ = build_command(argv, env, "py")
    folder = tmp_path / "models" / f"tiny-v{model.BUILD_VERSION}"
    assert cmd[cmd.index("--chat-template") + 1] == f"{folder}/chat_template.jinja"
    cmd, _ = build_command(["--model=pvc://c/qwen", "--chat-template=model://t/x.jinja"], {}, "py")
    assert "--chat-template=/models/qwen/t/x.jinja" in cmd


def test_a_template_file_of_a_hub_model_is_left_to_fetch() -> None:
    argv = ["--model", "hf://Qwen/Qwen3-8B", "--chat-template", "model://tool_use.jinja"]
    cmd, _ = build_command(argv, {}, "py")
    assert hub_template(cmd) == ("Qwen/Qwen3-8B", "tool_use.jinja")
    plain, _ = build_command(["--model", "hf://Qwen/Qwen3-8B", "--chat-template", "/t.jinja"], {})
    assert hub_template(plain) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "builtin://tiny", "--chat-template", "model://../../etc/passwd"],
        ["--model", "builtin://tiny", "--chat-template", "model:///etc/passwd"],
        ["--model", "s3://bucket/m", "--chat-template", "model://t.jinja"],
    ],
)
def test_template_files_outside_a_readable_model_are_refused(argv: list[str]) -> None:
    with pytest.raises(UsageError, match=r"chat template|inside the model"):
        build_command(argv, {})


NIXL_MR_FAILURE = (
    "E1204 10:00:00.000000 123 libfabric_rail.cpp:1234] fi_mr_reg failed on rail 3: "
    "Permission denied (buffer=0x7f00, length=1073741824, requested_key=0)"
)


def test_nixl_failing_to_register_memory_with_efa_calls_for_a_termination_message() -> None:
    message = termination_message(NIXL_MR_FAILURE + "\n")
    assert message is not None
    assert message.startswith(f"{config.EFA_REGISTRATION_FAILED}: E1204")
    assert "fi_mr_reg failed on rail 3: Permission denied" in message
    assert message.endswith(f"fix: {config.EFA_REGISTRATION_FIX}")
    assert "spec.efa.privileged: true" in message
    assert termination_message("fi_mr_regattr failed: Bad address") is not None
    assert termination_message("INFO registered 4 regions with fi_mr_reg") is None


def _run_stand_in(tmp_path, exit_code: int, termination_log) -> subprocess.CompletedProcess[bytes]:
    """`run` on a stand-in server that logs NIXL's failure on stderr, in a progress-bar-like
    chunk without a newline first, then exits with `exit_code`."""
    server = tmp_path / "server.py"
    server.write_text(
        textwrap.dedent(f"""
        import sys
        sys.stderr.write("Loading: 50%\\r")
        sys.stderr.write({NIXL_MR_FAILURE!r} + "\\n")
        sys.exit({exit_code})
    """)
    )
    runner = tmp_path / "runner.py"
    runner.write_text(
        textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from boomerang.connector.launch.entrypoint import run
        sys.exit(run([sys.executable, {str(server)!r}], {{}}, Path({str(termination_log)!r})))
    """)
    )
    return subprocess.run([sys.executable, str(runner)], capture_output=True, timeout=30)


def test_a_failed_server_leaves_the_fix_in_the_termination_message(tmp_path) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")  # Kubernetes creates the file
    done = _run_stand_in(tmp_path, 1, log)
    assert done.returncode == 1
    # The log passes through whole, carriage returns and all.
    assert f"Loading: 50%\r{NIXL_MR_FAILURE}\n".encode() in done.stderr
    written = log.read_text()
    assert written.startswith(f"{config.EFA_REGISTRATION_FAILED}: ")
    assert "spec.efa.privileged: true" in written


def test_no_termination_message_after_a_clean_exit_or_outside_kubernetes(tmp_path) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    assert _run_stand_in(tmp_path, 0, log).returncode == 0
    assert log.read_text() == ""  # the server exited cleanly: nothing to fix
    absent = tmp_path / "absent"
    assert _run_stand_in(tmp_path, 1, absent).returncode == 1
    assert not absent.exists()  # no file of Kubernetes' here: none is created
