"""The three images, built here with buildah from their own Dockerfiles on locally built bases
(e2e/images), run what they ship: the operator's and the router's entrypoints answer --help as the
image's user, the connector image imports vLLM, NIXL and Boomerang's connector from one
environment and finds the vLLM plugin entry point; a second build is a cache hit; the archives
import into a containerd. The connector Dockerfile's EFA steps are built on their own (on the
Python base, with a stand-in installer) to show that a missing or wrong checksum and a missing
efa provider fail the build.

Under CI (`CI` set) a missing tool or a failed build fails; elsewhere they skip. A cold build
takes minutes (the vLLM CPU stack); later runs take the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from images.build import NAMES, REPO, Builder, Built, cache_dir
from images.buildah import CONTAINERD_TOOLS, Buildah, install_tools, missing_tools
from images.containerd import import_images, listed, public_name

from boomerang.operator.api import DEFAULT_ROUTER_IMAGE

pytestmark = [pytest.mark.node, pytest.mark.timeout(5400)]
CI = bool(os.environ.get("CI"))


def unavailable(why: str) -> None:
    if CI:
        pytest.fail(why)
    pytest.skip(why)


def builder() -> Builder:
    missing = install_tools() if CI else missing_tools()
    if missing:
        unavailable(f"image tools missing: {' '.join(missing)} (Debian packages of those names)")
    return Builder()


@pytest.fixture(scope="module")
def built() -> dict[str, Built]:
    try:
        return builder().build(NAMES)
    except subprocess.CalledProcessError as exc:
        unavailable(f"image build failed: {exc}")
        raise


@pytest.fixture(scope="module")
def buildah() -> Buildah:
    return Buildah(cache_dir())


def run(buildah: Buildah, image: Built, *args: str, entrypoint: bool = True) -> str:
    argv = list(args)
    if entrypoint:
        argv = [*(buildah.config(image.key_ref).get("Entrypoint") or []), *argv]
    out = buildah.run_in(image.key_ref, argv)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("name", ["operator", "router"])
def test_python_image_runs_its_entrypoint_as_its_user(
    built: dict[str, Built], buildah: Buildah, name: str
) -> None:
    config = buildah.config(built[name].key_ref)
    assert config["Entrypoint"] == [f"boomerang-{name}"]
    assert config["User"] == "65532:65532"
    assert f"usage: boomerang-{name}" in run(buildah, built[name], "--help")
    # The uid has a name: kopf asks for it (getpass) when it starts, and fails without one.
    who = "import getpass, os; print(os.getuid(), getpass.getuser())"
    assert run(buildah, built[name], "python3", "-c", who, entrypoint=False).split() == [
        "65532",
        "nonroot",
    ]
    # The install is /usr/local's own, as in python:3.11-slim (not /usr/local/local).
    script = f"boomerang-{name}"
    where = f"import boomerang.{name} as m, shutil; print(m.__file__, shutil.which({script!r}))"
    path, script = run(buildah, built[name], "python3", "-c", where, entrypoint=False).split()
    assert path.startswith(f"/usr/local/lib/python3.11/site-packages/boomerang/{name}/")
    assert script == f"/usr/local/bin/boomerang-{name}"


CONNECTOR_PROBE = """
import json, shutil, sys
from importlib.metadata import entry_points
import torch, vllm, nixl
from nixl._api import nixl_agent
import boomerang.connector, boomerang.connector.engine_venv, boomerang.connector.plugin
plugins = {ep.name: ep for ep in entry_points(group="vllm.general_plugins")}
register = plugins["boomerang_stream_params"].load()
print(json.dumps({
    "python": sys.executable, "vllm": vllm.__file__, "connector": boomerang.connector.__file__,
    "nixl_build": nixl._pkg.__name__, "cuda": torch.version.cuda, "register": callable(register),
    "engine": shutil.which("boomerang-engine"),
    "missing": boomerang.connector.engine_venv.missing_system_needs(),
}))
"""


def test_connector_image_has_vllm_nixl_and_the_plugin_in_one_environment(
    built: dict[str, Built], buildah: Buildah
) -> None:
    config = buildah.config(built["connector"].key_ref)
    assert config["Entrypoint"] == ["boomerang-engine", "--"]
    probe = run(buildah, built["connector"], "python3", "-c", CONNECTOR_PROBE, entrypoint=False)
    found = json.loads(probe.strip().splitlines()[-1])
    assert found["register"] is True
    assert found["python"].startswith("/opt/vllm/bin/")
    prefix = "/opt/vllm/lib/python3.11/site-packages/"
    assert found["vllm"].startswith(prefix) and found["connector"].startswith(prefix)
    assert found["engine"] == "/opt/vllm/bin/boomerang-engine"
    assert found["missing"] == []  # libnuma, g++ and Python's headers (engine_venv.SYSTEM_NEEDS)
    # NIXL's loader picks the build matching torch's CUDA: the CUDA 12 one for a CPU torch.
    assert found["nixl_build"] == ("nixl_cu12" if found["cuda"] is None else "nixl_cu13")


def test_second_build_takes_the_cache(built: dict[str, Built]) -> None:
    started = time.monotonic()
    again = builder().build(NAMES)
    seconds = time.monotonic() - started
    # Keys follow the sources: an image whose files changed since the first build is rebuilt
    # (in a shared work tree, others may edit them); everything else comes from the cache.
    unchanged = [name for name, image in again.items() if image.key == built[name].key]
    assert {"python-base", "vllm-cpu"} <= set(unchanged)
    for name in unchanged:
        assert again[name].seconds == 0.0, name
    if len(unchanged) == len(again):
        assert seconds < 60, seconds
    for name in NAMES:
        archive = again[name].archive
        assert archive is not None and archive.is_file()


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Path]:
    """A private containerd (its own root, state and socket; no CRI) for an import."""
    if install_tools(CONTAINERD_TOOLS) if CI else missing_tools(CONTAINERD_TOOLS):
        unavailable("containerd and ctr missing (Debian package containerd)")
    binary = shutil.which("containerd")
    socket = tmp_path / "containerd.sock"
    config = tmp_path / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{tmp_path / "root"}"\nstate = "{tmp_path / "state"}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{socket}"\n'
        f'[ttrpc]\n  address = "{tmp_path / "ttrpc.sock"}"\n'
    )
    log = (tmp_path / "containerd.log").open("w")
    proc = subprocess.Popen([str(binary), "--config", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "containerd did not start"
            time.sleep(0.2)
        yield socket
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def test_archives_import_into_containerd(built: dict[str, Built], containerd: Path) -> None:
    # The two small images (the connector's archive takes the same path, with more bytes), as
    # the cache has them now: a rebuild since the first build replaced the older archives.
    small = list(builder().build(("operator", "router")).values())[1:]
    names = import_images(small, containerd, namespace="k8s.io")
    held = listed(containerd, namespace="k8s.io")
    for name in names:
        assert name in held
    assert public_name(built["router"].ref) in held
    assert public_name(built["router"].ref) == DEFAULT_ROUTER_IMAGE  # what the CRD defaults to


# A stand-in for aws-efa-installer: it installs an fi_info that answers like libfabric's.
EFA_FAKE_INSTALLER = """#!/bin/bash
set -e
install -D -m 755 fi_info /opt/amazon/efa/bin/fi_info
"""
FAKE_FI_INFO = """#!/bin/sh
case "$1" in
  --version) echo "fi_info: 2.1.0amzn"; echo "libfabric: 2.1.0amzn";;
  --list) printf 'tcp:\\n    version: 1.0\\n'; PROVIDERS;;
esac
"""


def efa_steps() -> str:
    """The connector Dockerfile's EFA steps, verbatim: its ARGs through the provider check."""
    text = (REPO / "connector" / "Dockerfile").read_text()
    return text[text.index("ARG EFA_INSTALLER_VERSION") : text.index("ENV LD_LIBRARY_PATH")]


def fake_installer(folder: Path, efa_provider: bool) -> str:
    """A tarball laid out as AWS's (aws-efa-installer/efa_installer.sh); returns its SHA-256."""
    installer = folder / "aws-efa-installer"
    installer.mkdir()
    efa = "printf 'efa:\\n    version: 2.1\\n'" if efa_provider else "true"
    for name, text in (("efa_installer.sh", EFA_FAKE_INSTALLER), ("fi_info", FAKE_FI_INFO)):
        (installer / name).write_text(text.replace("PROVIDERS", efa))
        (installer / name).chmod(0o755)
    with tarfile.open(folder / "efa.tar.gz", "w:gz") as tar:
        tar.add(installer, arcname="aws-efa-installer")
    return hashlib.sha256((folder / "efa.tar.gz").read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("no-checksum", "needs EFA_INSTALLER_SHA256"),
        ("wrong-checksum", "FAILED"),
        ("no-efa-provider", "has no efa provider"),
        ("efa-provider", "efa provider is present"),
    ],
)
def test_connector_efa_steps_verify_the_installer_and_its_provider(
    tmp_path: Path, case: str, expect: str
) -> None:
    b = builder()
    try:
        with b.lock():
            base = b.python_base()
    except subprocess.CalledProcessError as exc:
        unavailable(f"python base build failed: {exc}")
    sha = fake_installer(tmp_path, efa_provider=case != "no-efa-provider")
    sha = {"no-checksum": "", "wrong-checksum": "0" * 64}.get(case, sha)
    containerfile = tmp_path / "Containerfile"
    containerfile.write_text(f"FROM {base.key_ref}\n{efa_steps()}")
    args = {"EFA_INSTALLER_URL": "file:///efa/efa.tar.gz", "EFA_INSTALLER_SHA256": sha}
    volumes = (f"{tmp_path}:/efa:ro",)
    tag = f"localhost/boomerang/efa-check:{case}"
    try:
        out = b.buildah.bud(containerfile, tmp_path, [tag], args, volumes, capture=True)
        ok, log = True, out
    except subprocess.CalledProcessError as exc:
        ok, log = False, (exc.stdout or "") + (exc.stderr or "")
    finally:
        if b.buildah.has(tag):
            b.buildah.run("rmi", tag, capture=True)
    assert ok is (case == "efa-provider"), log[-3000:]
    assert expect in log, log[-3000:]
