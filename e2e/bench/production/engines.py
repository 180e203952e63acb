"""The production benchmark's engine sets and fronts: what runs, how it starts, what it counts.

Why a module of its own: the sitting (`bench_production.py`) orders runs and records them; what
a run runs on is this: the manifest for a regime, one engine set (P and D replicas placed as
`boomerang up` places them, each engine's every process on its core, stock vLLM or Boomerang's
engines), a fresh router over it, and the counters read from the engines and the router
(tokens by source, D's retained blocks, reuse outcomes and paths). The engine e2e suites
(`e2e/production`) start their engines and routers through the same functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from boomerang.local import engine_client, placement, processes, stack
from boomerang.local.engine_client import scrape, totals

from bench.harness import stock
from bench.harness.repo import REPO
from bench.production.modes import Regime

BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def manifest(regime: Regime, bidirectional: bool) -> Any:
    """examples/local-cpu.yaml with P's prefix cache on, the regime's replicas and KV sizes,
    the transfer direction of the engine set."""
    from boomerang.operator.api import DisaggregatedDeployment

    data = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    spec = data["spec"]
    spec["prefill"]["prefixCaching"] = True
    spec["prefill"]["replicas"], spec["decode"]["replicas"] = regime.prefill, regime.decode
    spec["kvTransfer"]["bidirectional"] = bidirectional
    spec["model"]["maxModelLen"] = regime.max_model_len
    for role, blocks in (("prefill", regime.p_blocks), ("decode", regime.d_blocks)):
        if blocks is not None:
            spec[role]["extraArgs"] = ["--num-gpu-blocks-override", str(blocks)]
    return DisaggregatedDeployment.model_validate(data)


PORTS = stack.LocalPorts(
    router=38080,
    prefill=38100,
    decode=38200,
    prefill_side_channel=35600,
    decode_side_channel=35700,
)
"""The benchmark's own ports (replica i of a role adds i): apart from `boomerang up`'s."""


@dataclass
class Engines:
    """One engine set: P and D urls, the processes (name -> pid, each a process group), the
    lease token (Boomerang's engines only), whether they are stock vLLM."""

    dd: Any
    run_dir: Path
    ports: stack.LocalPorts = PORTS
    stock: bool = False
    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    started: list[dict[str, Any]] = field(default_factory=list)
    """How each engine was started (command, VLLM_PLUGINS), for the record."""
    specs: dict[str, processes.ProcessSpec] = field(default_factory=dict)
    """Each engine's process spec by name (the soak starts a killed one again)."""

    @property
    def token(self) -> str:
        return stack.read_lease_token(self.run_dir)

    @property
    def urls(self) -> list[str]:
        return [*self.prefill, *self.decode]


def pinned(spec: processes.ProcessSpec, cpu: int) -> processes.ProcessSpec:
    """The engine with every process on its own core (`taskset`), as a pod's cpuset keeps a
    pod's processes: placement pins only an engine's compute threads, so its API server and
    engine core would float onto the other engine's core (a decoder stepping continuously then
    takes CPU from the prefill engine, which no pod on its own node can do). Both engine sets,
    stock and Boomerang's, run so."""
    return dataclasses.replace(spec, cmd=["taskset", "-c", str(cpu), *spec.cmd])


@contextlib.contextmanager
def engines(
    dd: Any,
    venv: Path,
    log: Any = print,
    ports: stack.LocalPorts = PORTS,
    stock_engines: bool = False,
    pin: bool = False,
) -> Iterator[Engines]:
    """Every engine replica `dd` asks for, placed as `boomerang up` places them (ports and a
    core per replica, `boomerang.local.placement`): Boomerang's engines with their lease API
    on, or (`stock_engines`) stock vLLM engines with the same arguments (`stock.py`); `pin`:
    every process of an engine on its core (`pinned`)."""
    run_dir = Path(tempfile.mkdtemp(prefix="boomerang-bench-production-"))
    env = dict(os.environ)
    stack.build_model(venv, dd.spec.model.source, env)
    token = None if stock_engines else stack.read_lease_token(run_dir)
    es = Engines(dd, run_dir, ports=ports, stock=stock_engines)
    replicas = placement.plan(stack.replica_counts(dd), ports, sorted(os.sched_getaffinity(0)))
    specs = []
    for r in replicas:
        spec = stack.engine_spec(
            dd, r.role, engine_venv=venv, ports=ports, run_dir=run_dir, base_env=env,
            lease_token=token, index=r.index, cpu=r.cpu,
        )  # fmt: skip
        if stock_engines:
            spec = stock.stock_spec(spec, venv, r.cpu, run_dir)
        if pin:
            spec = pinned(spec, r.cpu)
        specs.append(spec)
        es.specs[spec.name] = spec
        es.started.append(stock.describe(spec))
        (es.prefill if r.role == "prefill" else es.decode).append(r.url)
    bidirectional = dd.spec.kv_transfer.bidirectional
    kind = "stock vLLM" if stock_engines else "Boomerang" + ("" if bidirectional else " (quiet)")
    log(f"starting {len(specs)} {kind} engines, logs in {run_dir}")
    try:
        for spec in specs:
            es.pids[spec.name] = processes.spawn(spec).pid
        for spec in specs:
            processes.wait_healthy(spec, es.pids[spec.name], 900)
        yield es
    finally:
        for pid in reversed(es.pids.values()):
            processes.stop(pid, timeout=30)


def router_config(es: Engines, overrides: dict[str, Any], port: int) -> Any:
    """The router's configuration for the engine set (no lease token for stock engines: they
    have no lease API, and nothing but their metrics is polled)."""
    token = {} if es.stock else {"lease_token_file": str(stack.lease_token_file(es.run_dir))}
    return stack.router_settings(
        es.dd, es.ports, listen_port=port, log_json=True, **token, **overrides
    )


@contextlib.contextmanager
def router(es: Engines, name: str, overrides: dict[str, Any], port: int = 38080) -> Iterator[str]:
    """A router process with the rendered config plus `overrides`, ready with P and D."""
    cfg_file = es.run_dir / f"router-{name}.yaml"
    cfg_file.write_text(yaml.safe_dump(router_config(es, overrides, port)))
    spec = stack.router_spec(name, cfg_file, port, es.run_dir, dict(os.environ))
    pid = processes.spawn(spec).pid
    try:
        processes.wait_healthy(spec, pid, 60)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url)
        yield url
    finally:
        processes.stop(pid, timeout=30)


def _wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/ready", timeout=5) as resp:
                body = json.loads(resp.read())
            if body.get("ready") and not body.get("alone"):
                return
        time.sleep(0.5)
    raise RuntimeError(f"router {url} not ready with P and D in {timeout_s:.0f} s")


def retained_blocks(es: Engines) -> float:
    return engine_client.retained_blocks(es.decode, es.token)


def release_retained(es: Engines, timeout_s: float = 60.0) -> None:
    """Every D releases what it retains, so that the next run starts with D's KV free."""
    engine_client.release_retained(es.decode, es.token, timeout_s)


class Sampler(threading.Thread):
    """D's retained blocks, every `interval` seconds."""

    def __init__(self, es: Engines, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.es, self.interval = es, interval
        self.points: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.points.append((time.perf_counter(), retained_blocks(self.es)))
            self.halt.wait(self.interval)


def token_sources(urls: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for url in urls:
        for source, value in totals(scrape(url), BY_SOURCE, "source").items():
            out[source] = out.get(source, 0.0) + value
    return out


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    names = {"local_compute": "computed", "local_cache_hit": "cached"}
    names["external_kv_transfer"] = "pulled"
    return {names.get(k, k): after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def router_counts(url: str) -> dict[str, dict[str, float]]:
    """What the router counted over a run, and its cost model's coefficients at the end (what
    it learned, e.g. what a turn joining D cost D's streams)."""
    page = scrape(url)
    return {
        "reuse": totals(page, "boomerang_router_reuse_total", "outcome"),
        "path": totals(page, "boomerang_router_path_total", "path"),
        "claims": totals(page, "boomerang_router_claims_total", "result"),
        "released": totals(page, "boomerang_router_leases_released_total", "reason"),
        "coefficients": totals(page, "boomerang_router_cost_coefficient", "name"),
    }
