"""A P/D pair and its routers as `boomerang up` starts them, for the engine benchmarks.

Why here: the TTFT, partial-reuse, path, idle and agent benchmarks all drive the same real
pair (vLLM CPU build, NIXL, the lease API on) on the same ports, with the benchmark's model and
a short retention TTL; each one used to reach into the TTFT script for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from boomerang.local import processes, stack

from bench.harness.repo import REPO

PORTS = stack.LocalPorts(
    router=28080, prefill=28100, decode=28200, prefill_side_channel=25600, decode_side_channel=25700
)


def bench_manifest(model: str, ttl: str = "90s") -> Any:
    """examples/local-cpu.yaml with the benchmark's model and a short retention TTL."""
    from boomerang.operator.api import DisaggregatedDeployment

    data = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    spec = data["spec"]
    spec["model"].update(source=f"builtin://{model}", servedName=f"boomerang-{model}")
    spec["model"]["dtype"] = "bfloat16"
    # Every finished request pins its blocks on D for the TTL: keep it short so a long sweep
    # does not fill D's cache, and give D room.
    spec["kvTransfer"]["decoderBlocksTTL"] = ttl
    for var in spec["engine"]["env"]:
        if var["name"] == "VLLM_CPU_KVCACHE_SPACE":
            var["value"] = "3"
    return DisaggregatedDeployment.model_validate(data)


def rotation(modes: Sequence[str], rep: int) -> list[str]:
    """The modes in the order of repetition `rep`: rotated, so that no mode always runs right
    after the same other one (the engines' state after a turn colours the next)."""
    k = rep % len(modes)
    return [*modes[k:], *modes[:k]]


def rotated(sizes: Sequence[int], reps: int, modes: Sequence[str]) -> Iterator[tuple[int, str]]:
    """Every (size, mode) a sweep times, in its order: per size, `reps` repetitions of every
    mode, each repetition's modes rotated (`rotation`)."""
    for size in sizes:
        for rep in range(reps):
            for mode in rotation(modes, rep):
                yield size, mode


def stop_all(pids: list[int]) -> None:
    """Stop what a benchmark started, routers before the engines they call."""
    for pid in reversed(pids):
        processes.stop(pid, timeout=30)


def start_engines(
    dd: Any,
    run_dir: Path,
    venv: Path,
    ports: stack.LocalPorts = PORTS,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[int]]:
    """P and D as `boomerang up` runs them, lease API on (the run dir's token); `env` is the
    engines' base environment (default: this process's)."""
    env = dict(os.environ) if env is None else env
    stack.build_model(venv, dd.spec.model.source, env)
    token = stack.read_lease_token(run_dir)
    specs = [
        stack.engine_spec(
            dd, r, engine_venv=venv, ports=ports, run_dir=run_dir, base_env=env, lease_token=token
        )
        for r in ("prefill", "decode")
    ]
    pids = [processes.spawn(spec).pid for spec in specs]
    for spec, pid in zip(specs, pids, strict=True):
        processes.wait_healthy(spec, pid, 900)
    ctx: dict[str, Any] = {"model": dd.spec.model.served_name}
    ctx["p"] = f"http://127.0.0.1:{ports.prefill}"
    ctx["d"] = f"http://127.0.0.1:{ports.decode}"
    return ctx, pids


ROUTERS: dict[str, dict[str, Any]] = {
    "router_on": {"bidirectional": True},
    "router_off": {"bidirectional": False},
}
"""The two routers this benchmark compares: reuse on, and reuse off (P recomputes)."""


def start_routers(
    dd: Any,
    run_dir: Path,
    ctx: dict[str, Any],
    timeouts: dict[str, float],
    pids: list[int],
    routers: dict[str, dict[str, Any]] = ROUTERS,
    ports: stack.LocalPorts = PORTS,
) -> None:
    """One router per entry (name -> config overrides), timeouts sized by this machine, with
    the run dir's lease token (so an adaptive router can release D's blocks)."""
    token_file = str(stack.lease_token_file(run_dir))
    for i, (mode, overrides) in enumerate(routers.items()):
        port = ports.router + i
        cfg = stack.router_settings(
            dd, ports, listen_port=port, timeouts=timeouts, lease_token_file=token_file, **overrides
        )
        cfg_file = run_dir / f"{mode}.yaml"
        cfg_file.write_text(yaml.safe_dump(cfg))
        spec = stack.router_spec(mode, cfg_file, port, run_dir, dict(os.environ))
        pids.append(processes.spawn(spec).pid)
        processes.wait_healthy(spec, pids[-1], 60)
        ctx[mode] = f"http://127.0.0.1:{port}"
