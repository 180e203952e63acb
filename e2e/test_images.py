"""The three images, built here with buildah from their own Dockerfiles on locally built bases
(e2e/images), run what they ship: the operator's and the router's entrypoints answer --help as the
image's user, the connector image imports vLLM, NIXL and Boomerang's connector from one
environment and finds the vLLM plugin entry point; a second build is a cache hit; the archives
import into a containerd. The connector image here is built on the CPU stand-in with the
distribution's libfabric; test_image_gpu.py builds it on a CUDA 13 stand-in of vLLM's image,
test_image_efa.py its EFA step with a stand-in installer.

Under CI (`CI` set) a missing tool or a failed build fails; elsewhere they skip. A cold build
takes minutes (the vLLM CPU stack); later runs take the cache.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from images.build import NAMES, Built, cache_dir
from images.buildah import CONTAINERD_TOOLS, Buildah, install_tools, missing_tools
from images.containerd import import_images, listed, public_name
from images_testing import CI, build, builder, run_in, unavailable

from boomerang.operator.api import DEFAULT_ROUTER_IMAGE

pytestmark = [pytest.mark.node, pytest.mark.timeout(5400)]


@pytest.fixture(scope="module")
def built() -> dict[str, Built]:
    return build(NAMES)


@pytest.fixture(scope="module")
def buildah() -> Buildah:
    return Buildah(cache_dir())


run = run_in


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
import boomerang.connector, boomerang.connector.launch.engine_venv
import boomerang.connector.plugin.register
plugins = {ep.name: ep for ep in entry_points(group="vllm.general_plugins")}
register = plugins["boomerang_stream_params"].load()
print(json.dumps({
    "python": sys.executable, "vllm": vllm.__file__, "connector": boomerang.connector.__file__,
    "nixl_build": nixl._pkg.__name__, "cuda": torch.version.cuda, "register": callable(register),
    "engine": shutil.which("boomerang-engine"),
    "missing": boomerang.connector.launch.engine_venv.missing_system_needs(),
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
