"""Container images for the real node, made on this machine from Debian's busybox-static.

No image registry is reachable here, so the real node (`realnode.py`) cannot pull anything: its
sandbox (pause) image and the test pods' image are built locally as one OCI image archive that
`ctr images import` loads into containerd. Both images share one layer, a static busybox with
its applets linked under the usual paths; they differ only in their default command (the pause
image sleeps for ever, as PID 1 of each pod sandbox).

A second archive, built only when a test asks for it (`build_kubectl`), holds a kubectl image:
the busybox layer plus one with the harness's static kubectl, so a pod can call the API server
with in-cluster config (its ServiceAccount token and CA) without any client library.

Archives are cached under `$BOOMERANG_CACHE/node-images/`, named by a hash of their inputs (the
binaries and this builder's format version), and are byte-for-byte reproducible: fixed
mtimes and owners, sorted entries. Standard library only.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUSYBOX = Path(os.environ.get("BOOMERANG_BUSYBOX", "/bin/busybox"))
FORMAT = "1"  # bump when the archive's layout changes, so cached archives are rebuilt
REGISTRY = "boomerang.local"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PAUSE_CMD = ["/bin/sleep", "2147483647"]


def cache_dir() -> Path:
    cache = os.environ.get("BOOMERANG_CACHE") or str(Path.home() / ".cache" / "boomerang")
    return Path(cache) / "node-images"


def is_static_elf(path: Path) -> bool:
    """An ELF executable without a program interpreter (PT_INTERP), i.e. statically linked."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only
        return False
    order = "little" if data[5] == 1 else "big"
    phoff = int.from_bytes(data[0x20:0x28], order)
    phentsize = int.from_bytes(data[0x36:0x38], order)
    phnum = int.from_bytes(data[0x38:0x3A], order)
    for i in range(phnum):
        entry = phoff + i * phentsize
        if int.from_bytes(data[entry : entry + 4], order) == 3:  # PT_INTERP
            return False
    return True


def go_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


@dataclass(frozen=True)
class NodeImages:
    """The built archive and the names its images carry once imported."""

    archive: Path
    busybox: str  # a shell and the usual tools; default command `sh`
    pause: str  # the pod sandbox image: sleeps as PID 1


def _tar_add(tar: tarfile.TarFile, name: str, kind: bytes, mode: int, data: bytes = b"",
             link: str = "") -> None:  # fmt: skip
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
    info.uname = info.gname = "root"
    info.linkname = link
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _layer(busybox: bytes, applets: list[str]) -> bytes:
    """An uncompressed layer tar: busybox, a link per applet, /etc/passwd and the usual dirs."""
    dirs = {"bin", "dev", "etc", "proc", "root", "sbin", "sys", "usr", "usr/bin", "usr/sbin"}
    dirs |= {str(Path(a).parent) for a in applets} - {"."}
    files = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
        "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            _tar_add(tar, d + "/", tarfile.DIRTYPE, 0o755)
        _tar_add(tar, "tmp/", tarfile.DIRTYPE, 0o1777)
        _tar_add(tar, "bin/busybox", tarfile.REGTYPE, 0o755, busybox)
        for name, data in sorted(files.items()):
            _tar_add(tar, name, tarfile.REGTYPE, 0o644, data)
        for applet in sorted(set(applets) - {"bin/busybox"}):
            _tar_add(tar, applet, tarfile.SYMTYPE, 0o777, link="/bin/busybox")
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _image(blobs: dict[str, bytes], layer: dict[str, Any], cmd: list[str], name: str,
           more: tuple[dict[str, Any], ...] = (), env: tuple[str, ...] = ()) -> Any:  # fmt: skip
    arch = go_arch()
    layers = [layer, *more]
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Env": [PATH_ENV, *env], "Cmd": cmd, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in layers]},
        "history": [{"created_by": "e2e/node_images.py from Debian busybox-static"}],
    }
    config_desc = _blob(
        blobs,
        json.dumps(config, sort_keys=True).encode(),
        "application/vnd.oci.image.config.v1+json",
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": layers,
    }
    desc = _blob(
        blobs,
        json.dumps(manifest, sort_keys=True).encode(),
        "application/vnd.oci.image.manifest.v1+json",
    )
    desc["platform"] = {"architecture": arch, "os": "linux"}
    desc["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
    }
    return desc


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def _busybox(busybox: Path) -> bytes:
    if not is_static_elf(busybox):
        raise FileNotFoundError(
            f"{busybox} is not a static busybox (apt-get install busybox-static)"
        )
    return busybox.read_bytes()


def build(busybox: Path = BUSYBOX, directory: Path | None = None) -> NodeImages:
    """The OCI archive with both images: from the cache, or built (atomically) into it."""
    binary = _busybox(busybox)
    key = hashlib.sha256(FORMAT.encode() + binary).hexdigest()[:12]
    directory = directory or cache_dir()
    archive = directory / f"busybox-{key}.oci.tar"
    images = NodeImages(archive, f"{REGISTRY}/busybox:{key}", f"{REGISTRY}/pause:{key}")
    if archive.exists():
        return images
    blobs: dict[str, bytes] = {}
    layer = _blob(
        blobs, _layer(binary, _applets(busybox)), "application/vnd.oci.image.layer.v1.tar"
    )
    manifests = [
        _image(blobs, layer, ["sh"], images.busybox),
        _image(blobs, layer, PAUSE_CMD, images.pause),
    ]
    _write_archive(archive, blobs, manifests)
    return images


@dataclass(frozen=True)
class KubectlImage:
    archive: Path
    name: str  # busybox plus /usr/local/bin/kubectl; default command `kubectl version`


def build_kubectl(
    kubectl: Path, busybox: Path = BUSYBOX, directory: Path | None = None
) -> KubectlImage:
    """An archive with busybox and the harness's kubectl, which must be static (CGO off): the
    image has no libc. Cached by both binaries, like `build`."""
    if not is_static_elf(kubectl):
        raise FileNotFoundError(f"{kubectl} is not a static executable (build.sh: CGO_ENABLED=0)")
    base, binary = _busybox(busybox), kubectl.read_bytes()
    key = hashlib.sha256(FORMAT.encode() + base + b"\0kubectl\0" + binary).hexdigest()[:12]
    archive = (directory or cache_dir()) / f"kubectl-{key}.oci.tar"
    image = KubectlImage(archive, f"{REGISTRY}/kubectl:{key}")
    if archive.exists():
        return image
    blobs: dict[str, bytes] = {}
    media = "application/vnd.oci.image.layer.v1.tar"
    layer = _blob(blobs, _layer(base, _applets(busybox)), media)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("usr/", "usr/local/", "usr/local/bin/"):
            _tar_add(tar, d, tarfile.DIRTYPE, 0o755)
        _tar_add(tar, "usr/local/bin/kubectl", tarfile.REGTYPE, 0o755, binary)
    top = _blob(blobs, buf.getvalue(), media)
    # HOME: kubectl keeps its discovery cache under $HOME/.kube.
    manifest = _image(blobs, layer, ["kubectl", "version"], image.name, (top,), ("HOME=/root",))
    _write_archive(archive, blobs, [manifest])
    return image


def _write_archive(archive: Path, blobs: dict[str, bytes], manifests: list[Any]) -> None:
    """An OCI image layout as one tar, written under a temporary name and renamed."""
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(f".tmp{os.getpid()}")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, "oci-layout", tarfile.REGTYPE, 0o644, b'{"imageLayoutVersion":"1.0.0"}')
        _tar_add(
            tar, "index.json", tarfile.REGTYPE, 0o644, json.dumps(index, sort_keys=True).encode()
        )
        _tar_add(tar, "blobs/", tarfile.DIRTYPE, 0o755)
        _tar_add(tar, "blobs/sha256/", tarfile.DIRTYPE, 0o755)
        for digest, data in sorted(blobs.items()):
            _tar_add(tar, "blobs/sha256/" + digest.split(":", 1)[1], tarfile.REGTYPE, 0o644, data)
    tmp.rename(archive)


if __name__ == "__main__":
    print(build())
