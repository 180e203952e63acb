"""What the image tests share (test_images.py, test_image_efa.py, test_image_gpu.py): the
builder with its tools, and running a command in a built image.

Under CI (`CI` set) a missing tool or a failed build fails; elsewhere they skip."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from images.build import Builder, Built
from images.buildah import Buildah, install_tools, missing_tools

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


def build(names: tuple[str, ...]) -> dict[str, Built]:
    try:
        return builder().build(names)
    except subprocess.CalledProcessError as exc:
        unavailable(f"image build failed: {exc}")
        raise


def run_in(buildah: Buildah, image: Built, *args: str, entrypoint: bool = True) -> str:
    """A command's stdout in a fresh container of the image (its entrypoint first, unless
    `entrypoint` is False); a failure fails the test with its output."""
    argv = list(args)
    if entrypoint:
        argv = [*(buildah.config(image.key_ref).get("Entrypoint") or []), *argv]
    out = buildah.run_in(image.key_ref, argv)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def try_build(
    b: Builder,
    containerfile: Path,
    context: Path,
    build_args: dict[str, str],
    volumes: tuple[str, ...] = (),
) -> tuple[bool, str]:
    """Build a throwaway image: whether it built, and its log (stdout and stderr). The image
    is removed."""
    tag = f"localhost/boomerang/try:{containerfile.stem.lower()}"
    try:
        out = b.buildah.bud(containerfile, context, [tag], build_args, volumes, capture=True)
        return True, out
    except subprocess.CalledProcessError as exc:
        return False, (exc.stdout or "") + (exc.stderr or "")
    finally:
        if b.buildah.has(tag):
            b.buildah.run("rmi", tag, capture=True)
