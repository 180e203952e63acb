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
from images.build import REPO
from images_testing import builder, try_build, unavailable

pytestmark = [pytest.mark.node, pytest.mark.timeout(1800)]
VERSION = re.findall(
    r"^ARG EFA_INSTALLER_VERSION=(\S+)$", (REPO / "connector" / "Dockerfile").read_text(), re.M
)[0]
"""The version the Dockerfile pins: the stand-in is served under its name."""
SCRIPT = "connector/image/libfabric.sh"
FAKE_INSTALLER = """#!/bin/bash
set -e
install -D -m 755 fi_info /opt/amazon/efa/bin/fi_info
"""
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


def serve(folder: Path, keys: Keys, signer: str, efa_provider: bool, tamper: bool) -> str:
    """AWS's layout in `folder`; returns the tarball's SHA-256 (before any tampering)."""
    installer = folder / "src" / "aws-efa-installer"
    installer.mkdir(parents=True)
    providers = "printf 'efa:\\n    version: 2.1\\n'" if efa_provider else "true"
    for name, text in (("efa_installer.sh", FAKE_INSTALLER), ("fi_info", FAKE_FI_INFO)):
        (installer / name).write_text(text.replace("PROVIDERS", providers))
        (installer / name).chmod(0o755)
    tarball = folder / f"aws-efa-installer-{VERSION}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(installer, arcname="aws-efa-installer")
    keys.gpg("--local-user", signer, "--detach-sign", "-o", f"{tarball}.sig", str(tarball))
    (folder / "aws-efa-installer.key").write_text(keys.gpg("--armor", "--export"))
    sha = subprocess.run(["sha256sum", str(tarball)], capture_output=True, text=True, check=True)
    if tamper:
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
}


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
    keys = Keys(tmp_path / "gnupg")
    aws, other = keys.make("aws"), keys.make("other")
    served = tmp_path / "served"
    served.mkdir()
    signer = other if case == "another-key" else aws
    sha = serve(served, keys, signer, case != "no-efa-provider", tamper=case == "tampered")
    context = tmp_path / "context"
    (context / SCRIPT).parent.mkdir(parents=True)
    shutil.copy(REPO / SCRIPT, context / SCRIPT)
    containerfile = context / f"Containerfile.{case}"
    containerfile.write_text(f"FROM {base.key_ref}\n{libfabric_step()}")
    args = {"EFA_INSTALLER_BASE_URL": "file:///efa", "EFA_INSTALLER_KEY_FINGERPRINT": aws}
    args["EFA_INSTALLER_SHA256"] = {"signed-with-sha256": sha, "wrong-sha256": "0" * 64}.get(
        case, ""
    )
    if case == "distribution":
        args = {"LIBFABRIC": "distribution"}
    ok, log = try_build(b, containerfile, context, args, (f"{served}:/efa:ro",))
    builds, says = CASES[case]
    assert ok is builds, log[-3000:]
    assert says in log, log[-3000:]
    if case.startswith("signed"):
        assert f"signature by {aws} verified; SHA-256 {sha}" in log
