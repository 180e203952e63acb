"""Stock vLLM engines and vLLM's own P/D proxy, for the production benchmark's baselines.

Why: a baseline that loads Boomerang's plugin, middleware or worker extension is not what a
user runs without Boomerang. A stock engine here is vLLM's OpenAI server started the way vLLM
documents it (`python -m vllm.entrypoints.openai.api_server`; the CPU build has no working
`vllm` script), with the same release, model and arguments as Boomerang's engines less
everything of Boomerang's: no entrypoint, no general plugins (`VLLM_PLUGINS=""`: vLLM loads
every installed one otherwise), no `--middleware`, no `--worker-extension-cls`, and a
`--kv-transfer-config` that names only vLLM's own NixlConnector settings (bidirectional off).
vLLM's KV events stay on: they are vLLM's, and the routers that use them (the KV index) are
the baselines peers ship.

One change of the environment, not of vLLM: on the CPU platform vLLM's NixlConnector moves its
worker's main thread to the highest core of every NUMA node it reads from sysfs. Two engines on
one machine would both land on that core while the other idles, a starvation no pod with its
own cores sees. Boomerang's engines get the engine's own core through its plugin
(`boomerang.connector.plugin.cpu_pinning`); a stock engine instead runs in a private mount namespace
where `/sys/devices/system/node/node0` lists only its core (`unshare -m` and a bind mount):
the topology a one-core machine would show. Both sets are then placed alike: the worker on its
core (`VLLM_CPU_OMP_THREADS_BIND`), the API server and engine core where the kernel puts them.

vLLM's own proxy (`toy_proxy_server.py` of vLLM's NixlConnector tests, in the same source
distribution as the multi-turn client, fetched at run time by `multiturn_client.py`) routes
round-robin: P with `max_tokens` 1 and `do_remote_decode`, then D with P's params.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from boomerang.connector.launch.entrypoint import build_command
from boomerang.local import processes

VLLM_SERVER = ("-m", "vllm.entrypoints.openai.api_server")
BOOMERANG_FLAGS = ("--middleware", "--worker-extension-cls")
"""Flags whose value is Boomerang's code, dropped with their value."""
STOCK_KV_KEYS = ("kv_connector", "kv_role", "kv_buffer_device")
SYS_NODE = Path("/sys/devices/system/node")
MOUNT = 'mount --bind "$1" /sys/devices/system/node && shift && exec "$@"'


def stock_args(boomerang_args: Sequence[str]) -> list[str]:
    """Boomerang's rendered vLLM arguments for a role, as a user without Boomerang writes them."""
    out: list[str] = []
    args = list(boomerang_args)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in BOOMERANG_FLAGS:
            i += 2
            continue
        if arg == "--kv-transfer-config":
            kv = json.loads(args[i + 1])
            stock = {k: kv[k] for k in STOCK_KV_KEYS if k in kv}
            backends = kv.get("kv_connector_extra_config", {}).get("backends")
            if backends:
                stock["kv_connector_extra_config"] = {"backends": backends}
            out += [arg, json.dumps(stock, sort_keys=True, separators=(",", ":"))]
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def stock_env(boomerang_env: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment less Boomerang's variables, with vLLM's plugins off."""
    env = {k: v for k, v in boomerang_env.items() if not k.startswith("BOOMERANG_")}
    env["VLLM_PLUGINS"] = ""
    return env


def one_core_topology(root: Path, core: int) -> Path:
    """A copy of sysfs' NUMA node folder whose node0 lists only `core` (files copied, the
    core's entry a link to the real one), for a private mount over the real folder."""
    folder = root / f"sys-node-{core}"
    if folder.exists():
        shutil.rmtree(folder)
    node0 = folder / "node0"
    node0.mkdir(parents=True)
    for entry in SYS_NODE.iterdir():
        if entry.is_file():
            (folder / entry.name).write_bytes(_read(entry))
    real0 = SYS_NODE / "node0"
    for entry in real0.iterdir():
        if entry.is_file() and not entry.is_symlink():
            (node0 / entry.name).write_bytes(_read(entry))
    (node0 / f"cpu{core}").symlink_to(f"/sys/devices/system/cpu/cpu{core}")
    return folder


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # some sysfs files refuse reads (write-only, or no permission)
        return b""


def stock_spec(
    boomerang: processes.ProcessSpec, venv: Path, core: int, run_dir: Path
) -> processes.ProcessSpec:
    """The stock engine that stands for Boomerang's engine `boomerang` (its rendered spec)."""
    cmd = list(boomerang.cmd)
    # The model URI as a path vLLM loads (computed here, in the benchmark: the engine never
    # runs Boomerang's entrypoint).
    resolved, _ = build_command(cmd[cmd.index("--") + 1 :], boomerang.env)
    args = resolved[len(VLLM_SERVER) + 1 :]
    topology = one_core_topology(run_dir, core)
    server = [str(venv / "bin" / "python"), *VLLM_SERVER, *stock_args(args)]
    wrapped = ["unshare", "-m", "--propagation", "private", "bash", "-c", MOUNT, "stock"]
    return processes.ProcessSpec(
        name=boomerang.name,
        cmd=[*wrapped, str(topology), *server],
        env=stock_env(boomerang.env),
        log=boomerang.log,
        health_url=boomerang.health_url,
    )


def proxy_spec(
    proxy: Path, python: Path, port: int, prefill: Sequence[str], decode: Sequence[str], log: Path
) -> processes.ProcessSpec:
    """vLLM's toy P/D proxy over the engines' urls (`http://127.0.0.1:PORT`)."""

    def hosts_ports(urls: Sequence[str]) -> tuple[list[str], list[str]]:
        pairs = [u.removeprefix("http://").rsplit(":", 1) for u in urls]
        return [h for h, _ in pairs], [p for _, p in pairs]

    p_hosts, p_ports = hosts_ports(prefill)
    d_hosts, d_ports = hosts_ports(decode)
    cmd = [
        str(python), str(proxy), "--host", "127.0.0.1", "--port", str(port),
        "--prefiller-hosts", *p_hosts, "--prefiller-ports", *p_ports,
        "--decoder-hosts", *d_hosts, "--decoder-ports", *d_ports,
    ]  # fmt: skip
    return processes.ProcessSpec(
        name="vllm-proxy",
        cmd=cmd,
        env={"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": "unused"},
        log=log,
        health_url=f"http://127.0.0.1:{port}/healthcheck",
    )


def describe(spec: processes.ProcessSpec) -> dict[str, Any]:
    """What a run records of how an engine was started (no plugin, no middleware: checkable);
    absolute paths by their last part only, so that the record names no path of the machine."""
    cmd = [Path(c).name if c.startswith("/") else c for c in spec.cmd]
    return {"cmd": cmd, "VLLM_PLUGINS": spec.env.get("VLLM_PLUGINS")}


if __name__ == "__main__":  # print a role's stock arguments from Boomerang's: a quick look
    print(json.dumps(stock_args(sys.argv[1:])))
