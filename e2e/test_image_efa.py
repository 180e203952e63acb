"""The connector Dockerfile's libfabric step, built on its own on the Python base with a
stand-in of AWS's EFA installer (AWS is out of reach here): the tarball must carry a valid
signature by the key whose fingerprint the build pins, and match a SHA-256 when one is given,
before anything is unpacked; the installed libfabric must have the efa provider. And the
distribution's libfabric1 with libhwloc15, the path the image builds here take.

The stand-in is a tarball laid out as AWS's (`aws-efa-installer/efa_installer.sh`), signed with
a GPG key made for the test, served with its signature and key over file:// as AWS serves them
over https (`<base>/aws-efa-installer-<version>.tar.gz[.sig]`, `<base>/aws-efa-installer.key`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from images.build import REPO, Built
from images_testing import builder, try_build, unavailable

pytestmark = [pytest.mark.node, pytest.mark.timeout(1800)]
VERSION = re.findall(
    r"^ARG EFA_INSTALLER_VERSION=(\S+)$", (REPO / "connector" / "Dockerfile").read_text(), re.M
)[0]
"""The version the Dockerfile pins: the stand-in is served under its name."""
SCRIPT = "connector/image/libfabric.sh"
FAKE_INSTALLER = """#!/bin/bash
# A stand-in of AWS's efa_installer.sh: its -h lists its flags and it refuses others; on an
# image it takes for an NGC build image (NVIDIA's CUDA base: NVIDIA_REQUIRE_CUDA is set) it
# skips rdma-core unless NGC mode is turned off, as installers from 1.48.0 do; its packages
# are real .deb packages installed with dpkg, libfabric1-aws depending on rdma-core's, and a
# dependency dpkg cannot meet does not stop it (the silent skip the build must catch).
set -e
FLAGS="FLAGS_LISTED"
if [[ "$1" == -h || "$1" == --help ]]; then
  echo "Usage: efa_installer.sh [options]"
  for f in $FLAGS; do echo "  $f    an option"; done
  exit 0
fi
ngc_off=0
for arg in "$@"; do
  [[ " $FLAGS " == *" $arg "* ]] || { echo "efa_installer.sh: unknown option $arg" >&2; exit 1; }
  [[ "$arg" == --disable-build-ngc ]] && ngc_off=1
done
deb() {  # name version depends
  local root="/tmp/stand-in/$1"
  mkdir -p "$root/DEBIAN"
  printf 'Package: %s\\nVersion: %s\\n' "$1" "$2" >"$root/DEBIAN/control"
  printf 'Architecture: all\\nMaintainer: t <t@example.org>\\n' >>"$root/DEBIAN/control"
  [[ -n "$3" ]] && printf 'Depends: %s\\n' "$3" >>"$root/DEBIAN/control"
  printf 'Description: stand-in\\n' >>"$root/DEBIAN/control"
  dpkg-deb --build "$root" "/tmp/stand-in/$1.deb" >/dev/null
  echo "/tmp/stand-in/$1.deb"
}
if [[ -n "${NVIDIA_REQUIRE_CUDA:-}" && $ngc_off == 0 ]]; then
  echo "NGC build image detected: skipping rdma-core"
else
  for pkg in RDMA_PACKAGES; do dpkg -i "$(deb "$pkg" RDMA_VERSION "")" >/dev/null; done
fi
dpkg -i "$(deb libfabric1-aws 2.7.0amzn2.0 'ibverbs-providers (>= 59), libibverbs1 (>= 59)')" \\
  >/dev/null 2>&1 || echo "dpkg: dependency problems prevent configuration of libfabric1-aws"
install -D -m 755 fi_info /opt/amazon/efa/bin/fi_info
"""
ALL_FLAGS = "-y --yes --skip-kmod --skip-limit-conf --no-verify --skip-mpi --disable-build-ngc"
FAKE_FI_INFO = """#!/bin/sh
case "$1" in
  --version) echo "fi_info: 2.7.0amzn2.0"; echo "libfabric: 2.7.0amzn2.0";;
  --list) printf 'tcp:\\n    version: 1.0\\n'; PROVIDERS;;
esac
"""


def libfabric_step() -> str:
    """The Dockerfile's libfabric step, verbatim: its ARGs through its RUN."""
    text = (REPO / "connector" / "Dockerfile").read_text()
    return text[text.index("ARG LIBFABRIC=") : text.index("ENV LD_LIBRARY_PATH")]


class Keys:
    """GPG keys made for the test, in their own home."""

    def __init__(self, home: Path) -> None:
        if shutil.which("gpg") is None:
            unavailable("gpg missing (Debian package gpg)")
        self.home = home
        home.mkdir(mode=0o700)

    def gpg(self, *args: str) -> str:
        cmd = ["gpg", "--homedir", str(self.home), "--batch", "--quiet", *args]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    def make(self, name: str) -> str:
        self.gpg("--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.org>",
                 "ed25519", "sign", "never")  # fmt: skip
        colons = self.gpg("--with-colons", "--list-keys", f"{name}@example.org")
        return next(ln.split(":")[9] for ln in colons.splitlines() if ln.startswith("fpr:"))


def serve(folder: Path, keys: Keys, signer: str, case: str) -> str:
    """AWS's layout in `folder`, the stand-in as `case` wants it; returns the tarball's
    SHA-256 (before any tampering)."""
    installer = folder / "src" / "aws-efa-installer"
    installer.mkdir(parents=True)
    efa = case != "no-efa-provider"
    providers = "printf 'efa:\\n    version: 2.1\\n'" if efa else "true"
    knobs = {
        "PROVIDERS": providers,
        "FLAGS_LISTED": {
            "unknown-flag": ALL_FLAGS.replace(" --skip-mpi", ""),
            "ngc-skips-rdma-core": ALL_FLAGS.replace(" --disable-build-ngc", ""),
        }.get(case, ALL_FLAGS),
        "RDMA_PACKAGES": "ibverbs-providers"
        if case == "missing-libibverbs"
        else "ibverbs-providers libibverbs1",
        "RDMA_VERSION": "39.0-1" if case == "old-rdma-core" else "59.0-1",
    }
    for name, text in (("efa_installer.sh", FAKE_INSTALLER), ("fi_info", FAKE_FI_INFO)):
        for knob, value in knobs.items():
            text = text.replace(knob, value)
        (installer / name).write_text(text)
        (installer / name).chmod(0o755)
    tarball = folder / f"aws-efa-installer-{VERSION}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(installer, arcname="aws-efa-installer")
    keys.gpg("--local-user", signer, "--detach-sign", "-o", f"{tarball}.sig", str(tarball))
    (folder / "aws-efa-installer.key").write_text(keys.gpg("--armor", "--export"))
    sha = subprocess.run(["sha256sum", str(tarball)], capture_output=True, text=True, check=True)
    if case == "tampered":
        with tarball.open("ab") as handle:
            handle.write(b"\0")
    return sha.stdout.split()[0]


CASES = {  # case: (builds, what its log says)
    "signed": (True, "libfabric's efa provider is present"),
    "signed-with-sha256": (True, "libfabric's efa provider is present"),
    "no-efa-provider": (False, "the EFA installer ran, but libfabric has no efa provider"),
    "another-key": (False, "not by"),
    "tampered": (False, "no valid signature (refusing to unpack it)"),
    "wrong-sha256": (False, "not the expected"),
    "distribution": (True, "the distribution's libfabric1 and libhwloc15"),
    # the installer's own behaviour on vLLM's CUDA base (issue 45): each fails naming its cause
    "unknown-flag": (False, "has no flag --skip-mpi (not in its -h)"),
    "ngc-skips-rdma-core": (False, "ibverbs-providers is not installed after the EFA installer"),
    "missing-libibverbs": (False, "libibverbs1 is not installed after the EFA installer"),
    "old-rdma-core": (False, "ibverbs-providers 39.0-1 does not meet libfabric1-aws's dependency"),
}


def build_case(
    tmp_path: Path, case: str, base: Built, cuda_env: bool
) -> tuple[bool, str, str, str]:
    """The Dockerfile's libfabric step built on `base` with the stand-in served as `case`
    wants it; `cuda_env` adds the variable NVIDIA's CUDA images set, for a base without it.
    Returns whether it built, its log, the pinned key's fingerprint and the tarball's SHA-256."""
    keys = Keys(tmp_path / "gnupg")
    aws, other = keys.make("aws"), keys.make("other")
    served = tmp_path / "served"
    served.mkdir()
    signer = other if case == "another-key" else aws
    sha = serve(served, keys, signer, case)
    context = tmp_path / "context"
    (context / SCRIPT).parent.mkdir(parents=True)
    shutil.copy(REPO / SCRIPT, context / SCRIPT)
    containerfile = context / f"Containerfile.{case}"
    # as on vLLM's image, whose CUDA base sets this: what makes installers see an NGC image
    cuda = 'ENV NVIDIA_REQUIRE_CUDA="cuda>=12.8"\n' if cuda_env else ""
    containerfile.write_text(f"FROM {base.key_ref}\n{cuda}{libfabric_step()}")
    args = {"EFA_INSTALLER_BASE_URL": "file:///efa", "EFA_INSTALLER_KEY_FINGERPRINT": aws}
    args["EFA_INSTALLER_SHA256"] = {"signed-with-sha256": sha, "wrong-sha256": "0" * 64}.get(
        case, ""
    )
    if case == "distribution":
        args = {"LIBFABRIC": "distribution"}
    ok, log = try_build(builder(), containerfile, context, args, (f"{served}:/efa:ro",))
    return ok, log, aws, sha


def check_case(case: str, ok: bool, log: str, aws: str, sha: str) -> None:
    builds, says = CASES[case]
    assert ok is builds, log[-3000:]
    assert says in log, log[-3000:]
    if case.startswith("signed"):
        assert f"signature by {aws} verified; SHA-256 {sha}" in log
        assert "NGC mode turned off with --disable-build-ngc" in log
        assert "libfabric1-aws 2.7.0amzn2.0, ibverbs-providers 59.0-1, libibverbs1 59.0-1" in log


@pytest.mark.parametrize("case", list(CASES))
def test_the_installer_is_verified_before_it_is_unpacked_and_must_bring_efa(
    tmp_path: Path, case: str
) -> None:
    b = builder()
    try:
        with b.lock():
            base = b.python_base()
    except subprocess.CalledProcessError as exc:
        unavailable(f"python base build failed: {exc}")
    check_case(case, *build_case(tmp_path, case, base, cuda_env=True))


ON_CUDA_BASE = ("signed", "unknown-flag", "ngc-skips-rdma-core", "no-efa-provider")
"""The cases issue 45 names, on the CUDA 13 stand-in of vLLM's image: the default build passes;
an unknown flag, NGC mode skipping rdma-core and a libfabric without the efa provider each fail
naming the cause."""


@pytest.mark.release
@pytest.mark.parametrize("case", ON_CUDA_BASE)
def test_on_the_cuda_base_the_installer_runs_as_on_vllms_image(tmp_path: Path, case: str) -> None:
    """The same step on vllm-gpu, whose own environment (NVIDIA_REQUIRE_CUDA, as NVIDIA's CUDA
    images set it) is what makes the stand-in installer take it for an NGC build image: no
    variable is added here. Slow (the stand-in is several GB): `make test-release`."""
    b = builder()
    try:
        with b.lock():
            base = b.vllm_gpu_base(b.python_base())
    except subprocess.CalledProcessError as exc:
        unavailable(f"vllm-gpu build failed: {exc}")
    assert "NVIDIA_REQUIRE_CUDA=" in " ".join(b.buildah.config(base.key_ref).get("Env") or [])
    check_case(case, *build_case(tmp_path, case, base, cuda_env=False))
