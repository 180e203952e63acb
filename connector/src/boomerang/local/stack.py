"""The local runtime: the engines and the router as local processes (`boomerang up`).

The stack runs exactly what the operator renders for a `DisaggregatedDeployment`: engine
arguments and environment come from `boomerang.operator.render`, the router's configuration
from the same function that fills its ConfigMap. Every replica `spec.prefill.replicas` and
`spec.decode.replicas` ask for is started, and the router is given all of them. Only what is
local is overridden: every listener on 127.0.0.1, ports and a core per replica
(`boomerang.local.placement`), the NIXL side-channel host 127.0.0.1, logs and pid files under
the cache directory. One random lease token per run directory (`lease-token`, mode 0600) lets
the router release and renew D's retained blocks (`boomerang.connector.plugin.leases`): the engines
get it in their environment, the router the file's path (`lease_token_file`). The local stack
has one endpoint, so it runs one router whatever `spec.router.replicas` says, and says so.

`plan()` is pure (manifest in, process specs out); `up()`, `down()` and `status()` do the I/O.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from boomerang.connector.launch.engine_venv import engine_command
from boomerang.connector.launch.engine_venv import ensure as ensure_venv
from boomerang.connector.launch.model import cache_root
from boomerang.facts import engine as names
from boomerang.facts.engine import Role
from boomerang.local import calibrate, placement, processes
from boomerang.local.placement import LocalPorts as LocalPorts
from boomerang.local.placement import Replica

DEFAULT_MANIFEST = Path(__file__).resolve().parent / "local-cpu.yaml"
"""The embedded default of `boomerang up` and `boomerang demo` (also `examples/local-cpu.yaml`)."""
ENGINE_START_TIMEOUT_S = 600.0
LEASE_TOKEN_FILE = "lease-token"


PAIR_CORES: Mapping[Role, int] = {"prefill": 0, "decode": 1}
"""The cores of one prefill and one decode engine when no placement is given (the tests' and
benchmarks' pair on two cores): P and D on different cores, see `boomerang.local.placement`."""


def load_manifest(path: Path) -> Any:
    """Parse and validate a DisaggregatedDeployment manifest with the operator's API model."""
    from boomerang.operator.api import DisaggregatedDeployment

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read manifest {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != "DisaggregatedDeployment":
        raise ValueError(f"{path} is not a DisaggregatedDeployment manifest")
    return DisaggregatedDeployment.model_validate(data)


def engine_local_env(side_channel_port: int, cpu: int) -> dict[str, str]:
    """The local overrides on top of the rendered engine environment."""
    return {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu),
        "BOOMERANG_KV_CPUS": str(cpu),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def replica_counts(dd: Any) -> dict[Role, int]:
    """How many engines of each role the manifest asks for."""
    return {role: getattr(dd.spec, role).replicas for role in names.ROLES}


def engine_spec(
    dd: Any,
    role: Role,
    *,
    engine_venv: Path,
    ports: LocalPorts,
    run_dir: Path,
    base_env: Mapping[str, str],
    lease_token: str | None = None,
    index: int = 0,
    cpu: int | None = None,
) -> processes.ProcessSpec:
    """How to run replica `index` of one role's engine locally, from the operator's rendering
    of the manifest, on core `cpu` (default `PAIR_CORES`); `lease_token` switches on the
    engine's lease API (`boomerang.connector.plugin.leases`)."""
    from boomerang.operator import render

    port = ports.http(role, index)
    core = PAIR_CORES[role] if cpu is None else cpu
    args = render.engine_args(dd, role, host="127.0.0.1", port=port)
    local = engine_local_env(ports.side_channel(role, index), core)
    env = {**base_env, **render.engine_env(dd, role), **local}
    if lease_token:
        env[names.LEASE_TOKEN_ENV] = lease_token
    name = f"{role}-{index}"
    return processes.ProcessSpec(
        name=name,
        cmd=[*engine_command(engine_venv), *args],
        env=env,
        log=run_dir / f"{name}.log",
        health_url=f"http://127.0.0.1:{port}/health",
    )


def router_settings(dd: Any, ports: LocalPorts, **overrides: Any) -> dict[str, Any]:
    """The router's configuration (as its YAML file holds it), pointed at every local engine
    replica; `overrides` merge into it (a nested mapping such as `timeouts` keeps its other
    keys)."""
    from boomerang.operator import render
    from boomerang.operator.merge import deep_merge

    counts = replica_counts(dd)
    prefill, decode = (
        {"urls": [f"http://127.0.0.1:{ports.http(role, i)}" for i in range(counts[role])]}
        for role in names.ROLES
    )
    data = render.router_config(dd, prefill, decode)
    data.update(listen_host="127.0.0.1", listen_port=ports.router, log_json=False)
    if data.get("store", {}).get("kind") == "redis" and data["store"].get("url") == (
        "redis://from-env"
    ):
        raise ValueError("the local runtime needs spec.router.store.url for a redis store")
    return deep_merge(data, overrides)


def router_spec(
    name: str, config_file: Path, port: int, run_dir: Path, base_env: Mapping[str, str]
) -> processes.ProcessSpec:
    return processes.ProcessSpec(
        name=name,
        cmd=[sys.executable, "-m", "boomerang.router", "--config", str(config_file)],
        env=dict(base_env),
        log=run_dir / f"{name}.log",
        health_url=f"http://127.0.0.1:{port}/health",
    )


def run_dir(env: Mapping[str, str] | None = None) -> Path:
    root: Path = cache_root(dict(os.environ if env is None else env))
    return root / "local"


def ensure_engine_venv() -> Path:
    """The engine venv (installed on first use, cached), with this Boomerang linked in."""
    venv = ensure_venv()
    assert venv is not None  # ensure() builds it or raises
    return venv


def build_model(engine_venv: Path, source: str, env: Mapping[str, str]) -> None:
    """Build a `builtin://` model once, before P and D start (each would wait for it)."""
    if not source.startswith("builtin://"):
        return
    name = source.removeprefix("builtin://")
    cmd = [str(engine_venv / "bin" / "python"), "-m", "boomerang.connector.launch.model", name]
    subprocess.run(cmd, check=True, env=dict(env), stdout=subprocess.DEVNULL)


def lease_token_file(rdir: Path) -> Path:
    """The run directory's lease token: made once (random, mode 0600), then reused."""
    path = rdir / LEASE_TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.read_text().strip():
            return path
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    os.chmod(path, 0o600)
    return path


def read_lease_token(rdir: Path) -> str:
    return lease_token_file(rdir).read_text().strip()


def _state_file(rdir: Path) -> Path:
    return rdir / "state.json"


def read_state(rdir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_state_file(rdir).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_state(rdir: Path, state: dict[str, Any]) -> None:
    tmp = _state_file(rdir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(_state_file(rdir))


def up(manifest: Path, ports: LocalPorts | None = None, log: Any = print) -> str:
    """Start every engine replica and the router; returns the OpenAI base URL. Stops
    everything on failure."""
    ports = ports or LocalPorts()
    dd = load_manifest(manifest)
    replicas = place(dd, ports, sorted(os.sched_getaffinity(0)), log)
    rdir = run_dir()
    state = read_state(rdir)
    if state and any(processes.alive(p["pid"]) for p in state.get("processes", [])):
        raise RuntimeError(f"a local stack is already up ({state.get('endpoint')}): boomerang down")
    rdir.mkdir(parents=True, exist_ok=True)
    venv = ensure_engine_venv()
    base_env = dict(os.environ)
    log(f"Building model {dd.spec.model.source} (cached after the first run)")
    build_model(venv, dd.spec.model.source, base_env)
    config_file = rdir / "router.yaml"
    token_file = lease_token_file(rdir)
    token = read_lease_token(rdir)
    engines = [
        engine_spec(
            dd,
            r.role,
            engine_venv=venv,
            ports=ports,
            run_dir=rdir,
            base_env=base_env,
            lease_token=token,
            index=r.index,
            cpu=r.cpu,
        )
        for r in replicas
    ]
    endpoint = f"http://127.0.0.1:{ports.router}/v1"
    state = {"name": dd.name, "endpoint": endpoint, "model": dd.spec.model.served_name}
    state["engines"] = {role: [r.url for r in replicas if r.role == role] for role in names.ROLES}
    state["processes"] = []
    try:
        # Engines first (they start together), the router once they answer: it would otherwise
        # eject them as unhealthy while they load.
        _start(engines, state, rdir, log)
        timeouts = calibrated_timeouts(dd, ports, log)
        settings = router_settings(dd, ports, timeouts=timeouts, lease_token_file=str(token_file))
        config_file.write_text(yaml.safe_dump(settings, sort_keys=True))
        _start([router_spec("router", config_file, ports.router, rdir, base_env)], state, rdir, log)
    except BaseException:
        down(log=lambda _msg: None)
        raise
    return endpoint


def place(dd: Any, ports: LocalPorts, cpus: list[int], log: Any) -> list[Replica]:
    """Every engine replica the manifest asks for, with its ports and core, saying what the
    local stack does differently from a cluster; raises PlacementError for counts it cannot
    run, before anything is installed or started."""
    replicas = placement.plan(replica_counts(dd), ports, cpus)
    for r in replicas:
        log(f"Placing {r.name} on core {r.cpu}: {r.url}, NIXL side channel {r.side_channel_port}")
    for line in placement.shared_cores(replicas):
        log(f"Sharing cores: {line} ({len(replicas)} engines on {len(set(cpus))} cores)")
    if dd.spec.router.replicas > 1:
        log(
            f"spec.router.replicas is {dd.spec.router.replicas}: the local stack runs one router "
            f"(one endpoint on this machine)"
        )
    return replicas


def calibrated_timeouts(dd: Any, ports: LocalPorts, log: Any) -> dict[str, float]:
    """The router's prefill-bound timeouts, from P's measured speed at the longest prompt."""
    longest = dd.spec.model.max_model_len or calibrate.DEFAULT_LONGEST
    cost = calibrate.measure(f"http://127.0.0.1:{ports.prefill}", dd.spec.model.served_name)
    timeouts = calibrate.router_timeouts(cost, longest)
    log(
        f"Measured prefill {cost.rate(1024):.0f} tokens/s at 1024 tokens; router prefill "
        f"timeout {timeouts['prefill_s']:.0f}s for {longest}-token prompts"
    )
    return timeouts


def _start(specs: list[processes.ProcessSpec], state: dict[str, Any], rdir: Path, log: Any) -> None:
    pids = []
    for spec in specs:
        proc = processes.spawn(spec)
        pids.append(proc.pid)
        state["processes"].append({"name": spec.name, "pid": proc.pid, "log": str(spec.log)})
        _write_state(rdir, state)
        log(f"Started {spec.name} pid={proc.pid} log={spec.log}")
    for spec, pid in zip(specs, pids, strict=True):
        took = processes.wait_healthy(spec, pid, ENGINE_START_TIMEOUT_S)
        log(f"Ready {spec.name} after {took:.0f}s ({spec.health_url})")


def down(log: Any = print) -> int:
    """Stop the local stack (router first, so no request reaches a stopping engine)."""
    rdir = run_dir()
    state = read_state(rdir)
    if not state:
        log("No local stack is up")
        return 0
    stopped = 0
    for entry in reversed(state.get("processes", [])):
        if processes.alive(entry["pid"]):
            processes.stop(entry["pid"])
            stopped += 1
            log(f"Stopped {entry['name']} pid={entry['pid']}")
    _state_file(rdir).unlink(missing_ok=True)
    return stopped


def status() -> dict[str, Any] | None:
    """The recorded stack with each process's liveness and health."""
    state = read_state(run_dir())
    if not state:
        return None
    for entry in state.get("processes", []):
        entry["alive"] = processes.alive(entry["pid"])
    return state
