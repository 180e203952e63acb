"""What the production tests share: the engine venv, the manifest they start from, and a
completion turn through a router or on one engine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from boomerang.connector.launch import engine_venv as engine_venvs
from boomerang.local import pdclient

REPO = Path(__file__).resolve().parents[2]
MAX_TOKENS = 8


def venv() -> Path:
    ci = bool(os.environ.get("CI"))
    try:
        found = engine_venvs.ensure(None, check=not ci)
    except RuntimeError as exc:
        pytest.fail(f"engine venv install failed under CI: {exc}")
    if found is None:
        pytest.skip("engine venv not installed (make engine); CI unset")
    return found


def manifest(**spec: Any) -> Any:
    """examples/local-cpu.yaml with P's prefix cache on and `spec` merged into its spec."""
    from boomerang.operator.api import DisaggregatedDeployment
    from boomerang.operator.merge import deep_merge

    data = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    data["spec"]["prefill"]["prefixCaching"] = True
    data["spec"] = deep_merge(data["spec"], spec)
    return DisaggregatedDeployment.model_validate(data)


def completion(url: str, model: str, prompt: list[int], conv: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {**pdclient.completion_body(model, prompt, MAX_TOKENS), "stream": False}
    if conv is not None:
        body["conversation_id"] = conv
    return pdclient.post(f"{url}/v1/completions", body, 600)


def answer(resp: dict[str, Any]) -> tuple[list[int], list[float]]:
    choice = resp["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]
