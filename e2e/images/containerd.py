"""Imports the images that build.py archived into a containerd, where a real kubelet finds them.

Why it exists: the real-node tests run their own containerd (own socket, no registry), so the
images reach it as archives: `ctr -n k8s.io images import`, the namespace the kubelet's CRI
uses, unpacked for its snapshotter, so that pods with `imagePullPolicy: Never` or
`IfNotPresent` start without a pull. Each image is also tagged with its public name
(`<registry>/<name>:<version>`, the published image that the chart's and the CRD's defaults
name; the registry is the chart's `image.registry`), so manifests that keep those defaults run
the local build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class Archived(Protocol):
    """What build.Built offers: a local tag, the key of its inputs, the archive that carries it."""

    ref: str
    key: str
    archive: Path | None


KEY_LABEL = "boomerang.dev/build-key"
"""Set on each imported image: a containerd that keeps its store between runs (the real node's)
already holds an image whose label matches the build's key, and its import is skipped."""


CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "boomerang" / "values.yaml"


def registry() -> str:
    """The chart's `image.registry` (read with the standard library: build.sh needs no venv)."""
    match = re.search(r"^image:\n(?:  .*\n)*?  registry: *(\S+)", CHART_VALUES.read_text(), re.M)
    if not match:
        raise ValueError(f"no image.registry in {CHART_VALUES}")
    return match[1].strip("\"'")


def public_name(ref: str) -> str:
    """localhost/boomerang/router:0.1.0 -> <registry>/router:0.1.0"""
    return f"{registry()}/{ref.removeprefix('localhost/boomerang/')}"


def import_images(
    images: Iterable[Archived],
    address: str | os.PathLike[str],
    namespace: str = "k8s.io",
    snapshotter: str | None = None,
    public_names: bool = True,
    ctr: str | None = None,
    timeout_s: float = 1200.0,
) -> list[str]:
    """Imports each image's archive through the containerd at `address` into `namespace`;
    returns the names it now has there. An image it already holds with the build's key (see
    KEY_LABEL) is not imported again. `snapshotter` must match the CRI plugin's (containerd's
    default, overlayfs, when None)."""
    binary = ctr or shutil.which("ctr")
    if binary is None:
        raise FileNotFoundError("ctr not found (Debian: apt-get install containerd)")
    base = [binary, "--address", str(address), "--namespace", namespace]
    names: list[str] = []
    for image in images:
        if image.archive is None:
            raise ValueError(f"{image.ref} has no archive to import")
        if held_key(base, image.ref) != image.key:
            cmd = [*base, "images", "import"]
            if snapshotter:
                cmd += ["--snapshotter", snapshotter]
            subprocess.run([*cmd, str(image.archive)], check=True, timeout=timeout_s)
            label = [*base, "images", "label", image.ref, f"{KEY_LABEL}={image.key}"]
            subprocess.run(label, check=True, capture_output=True)
        names.append(image.ref)
        if public_names:
            alias = public_name(image.ref)
            subprocess.run([*base, "images", "tag", "--force", image.ref, alias], check=True)
            names.append(alias)
    drop_superseded(base)
    return names


def drop_superseded(base: list[str]) -> list[str]:
    """Remove the images no name points at any more; returns their references.

    The CRI plugin names every image it has seen by its id too (`sha256:...`). A new import
    under an old name moves the name, but that id reference keeps the old image and its
    unpacked layers alive, so a store kept between runs would grow by an image per rebuild
    (it reached 24 GB). An id whose image no named reference shares is such a leftover."""
    out = subprocess.run([*base, "images", "ls"], capture_output=True, text=True, check=True)
    rows = [line.split() for line in out.stdout.splitlines()[1:] if line.strip()]
    named = {row[2] for row in rows if len(row) > 2 and not row[0].startswith("sha256:")}
    stale = [row[0] for row in rows if row[0].startswith("sha256:") and row[2] not in named]
    for ref in stale:
        subprocess.run([*base, "images", "rm", ref], check=False, capture_output=True)
    return stale


def held_key(base: list[str], ref: str) -> str | None:
    """The build key of the image `ref` that containerd holds, if it holds one."""
    out = subprocess.run(
        [*base, "images", "ls", f"name=={ref}"], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(re.escape(KEY_LABEL) + r"=([0-9a-f]+)", out)
    return match[1] if match else None


def listed(address: str | os.PathLike[str], namespace: str = "k8s.io") -> list[str]:
    """The image names that containerd holds in `namespace`."""
    binary = shutil.which("ctr") or "ctr"
    out = subprocess.run(
        [binary, "--address", str(address), "--namespace", namespace, "images", "ls", "-q"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.split()
