"""One real P/D pair for the whole data-plane session, plus routers and Redis on demand.

Engines take 50-100 s to start on two cores and ~3.5 GB each, so one prefill and one decode
engine (vLLM CPU build, NIXL over UCX) are started once, from `examples/local-cpu.yaml`
through the local runtime's own `engine_spec` (exactly what `boomerang up` runs), and reused by
every test; only the fault tests restart one. Routers are real `boomerang-router` processes
with the configuration the operator renders, pointed at these engines; they start in a second.

Skips only when the engine venv is absent and `CI` is unset; under CI a missing venv fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube import free_port

from boomerang.connector.launch import engine_venv as engine_venvs
from boomerang.local import processes, stack
from boomerang.local.engine_client import release_retained, scrape

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "local-cpu.yaml"
PORTS = stack.LocalPorts(
    router=18080, prefill=18100, decode=18200, prefill_side_channel=15600, decode_side_channel=15700
)
ENGINE_START_S = 900.0
ENGINE_ROLES = ("prefill", "decode")
"""The processes the session keeps across modules; every other one (routers) is a module's."""
RELEASE_S = 60.0
"""How long D may take to give up what the stopped routers' conversations retain (a claimed
lease waits out its claim, `kv_lease_duration` 30 s)."""


def engine_venv(route: str | None = None) -> Path | None:
    """The engine venv of `route` (the default route when None): built under CI, where a
    missing one fails the test; elsewhere only used when already built."""
    ci = bool(os.environ.get("CI"))
    try:
        return engine_venvs.ensure(route, check=not ci)
    except RuntimeError as exc:
        pytest.fail(f"engine venv install failed under CI: {exc}")


@dataclass
class DataPlane:
    """The running engines and helpers to start routers against them."""

    venv: Path
    run_dir: Path
    dd: Any
    model: str
    pids: dict[str, int] = field(default_factory=dict)
    specs: dict[str, processes.ProcessSpec] = field(default_factory=dict)

    @property
    def lease_token(self) -> str:
        """The bearer token of the engines' lease API (one per run dir, as `boomerang up`)."""
        return stack.read_lease_token(self.run_dir)

    @property
    def p_url(self) -> str:
        return f"http://127.0.0.1:{PORTS.prefill}"

    @property
    def d_url(self) -> str:
        return f"http://127.0.0.1:{PORTS.decode}"

    def start_engines(self, roles: tuple[str, ...] = ENGINE_ROLES) -> None:
        for role in roles:
            spec = stack.engine_spec(
                self.dd,
                role,  # type: ignore[arg-type]
                engine_venv=self.venv,
                ports=PORTS,
                run_dir=self.run_dir,
                base_env=dict(os.environ),
                lease_token=self.lease_token,
            )
            self.specs[role] = spec
            self.pids[role] = processes.spawn(spec).pid
        for role in roles:
            processes.wait_healthy(self.specs[role], self.pids[role], ENGINE_START_S)

    def kill(self, name: str) -> None:
        processes.kill(self.pids.pop(name))

    def router(self, name: str, **overrides: Any) -> str:
        """Start a router process with the rendered config plus `overrides`; returns its URL.

        Its port is one nobody listens on: counting up from the router's base port once reached
        P's port after 19 routers, the router could not bind, and P, answering the health
        check and the turns, stood in for it unseen (a CI run's `{}` reuse outcome)."""
        port = free_port()
        overrides.setdefault("lease_token_file", str(stack.lease_token_file(self.run_dir)))
        settings = stack.router_settings(self.dd, PORTS, **overrides)
        settings.update(listen_port=port, log_level="DEBUG")
        config_file = self.run_dir / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(settings))
        spec = stack.router_spec(name, config_file, port, self.run_dir, dict(os.environ))
        self.pids[name] = processes.spawn(spec).pid
        processes.wait_healthy(spec, self.pids[name], 60.0)
        url = f"http://127.0.0.1:{port}"
        assert "boomerang_router_kv_index_blocks" in scrape(url), f"{url} is not router {name}"
        return url

    def stop_routers(self) -> None:
        """Stop every process but the engines, then have D give up what it retains, so the
        next module starts on an idle D holding nothing. A router left running probes D again
        whenever D comes back (`idle_probe`): after one test restarted D, eight earlier
        modules' routers timed answers there during a later test that counts D's computed
        tokens (a CI run read 392 where at most 166 were the test's own). And what a stopped
        router's conversations retain on D is freed when its leases lapse, tens of seconds
        later, in the middle of a test that watches D's KV use."""
        for name in [n for n in self.pids if n not in ENGINE_ROLES]:
            processes.stop(self.pids.pop(name), timeout=30.0)
        if "decode" in self.pids:
            left = release_retained([self.d_url], self.lease_token, RELEASE_S)
            if left:
                said = f"D retains {left:.0f} blocks {RELEASE_S:.0f} s after the routers stopped"
                warnings.warn(said, stacklevel=2)

    def stop_all(self) -> None:
        for name in list(self.pids):
            processes.stop(self.pids.pop(name), timeout=30.0)


_RUNNING: list[DataPlane] = []
"""The session's plane while its engines run: stopped when this folder's last test is done."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Engines hold ~7 GB and spin on the two cores: they stop once the tests that use them are
    over, not at the end of the session, where they would starve the real node's engines.
    Routers stop when their module is done, so no module sees another's traffic on D: after
    the module's own fixtures are torn down (they may still talk to them)."""
    result = yield
    if not _RUNNING:
        return result
    here = Path(__file__).resolve().parent
    if nextitem is None or Path(nextitem.path).resolve().parent != here:
        _RUNNING.pop().stop_all()
    elif Path(nextitem.path) != Path(item.path):
        _RUNNING[0].stop_routers()
    return result


@pytest.fixture(scope="session")
def dataplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlane]:
    venv = engine_venv()
    if venv is None:
        pytest.skip("engine venv not installed (make engine); CI unset")
    dd = stack.load_manifest(MANIFEST)
    run_dir = tmp_path_factory.mktemp("dataplane")
    stack.build_model(venv, dd.spec.model.source, dict(os.environ))
    plane = DataPlane(venv=venv, run_dir=run_dir, dd=dd, model=dd.spec.model.served_name)
    try:
        plane.start_engines()
        _RUNNING.append(plane)
        yield plane
    finally:
        if plane in _RUNNING:
            _RUNNING.remove(plane)
        plane.stop_all()
        logs = os.environ.get("BOOMERANG_KEEP_LOGS")
        if logs:
            shutil.copytree(run_dir, logs, dirs_exist_ok=True)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server missing under CI (make redis)")
        pytest.skip("redis-server not installed")
    port = 16379
    workdir = tmp_path_factory.mktemp("redis")
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(workdir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
