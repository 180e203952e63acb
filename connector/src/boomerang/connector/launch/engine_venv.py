"""The engine venv: vLLM's CPU build and NIXL, plus the very Boomerang that asked for it.

`install-engine.sh` (shipped in this package) builds the third-party part once per route and
caches it (see the script for the routes: a local wheel folder, PyTorch's CPU index, PyPI
alone). Boomerang is then linked in from the caller's own installation: the files of the
`boomerang` distribution that live in the caller's site-packages (the package itself for a
regular install; the import finder for an editable one) are copied into the venv's
site-packages, with the distribution's metadata, so vLLM finds Boomerang's plugin through its
entry point. That keeps one code path for a checkout (`make demo`, CI's fresh clone) and for
`pip install boomerang`, and re-links whenever the caller's installation changes.

    python -m boomerang.connector.launch.engine_venv [--route ROUTE] [--check]   # prints the venv
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

INSTALL_SCRIPT = Path(__file__).resolve().parent / "install-engine.sh"
ROUTES = ("auto", "wheels", "torch-index", "pypi")
LINK_RECORD = ".boomerang-link.json"
"""In the venv: which installation was linked, and the files copied for it."""


def _script(route: str | None, check: bool) -> Path | None:
    args = ["bash", str(INSTALL_SCRIPT)]
    if check:
        args.append("--check")
    if route is not None:
        args += ["--route", route]
    out = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        if check:
            return None
        raise RuntimeError(f"the engine install failed (exit {out.returncode}): {' '.join(args)}")
    return Path(out.stdout.strip().splitlines()[-1])


SYSTEM_NEEDS = {
    "libnuma.so.1": "libnuma1",
    "g++": "g++",
    "Python.h": "python3-dev",
}
"""What vLLM's CPU engine takes from the system, which no wheel carries (-> its Debian package).
vLLM's CPU kernels (`vllm._C_AVX2`) link against libnuma: without it the worker dies at start.
torch's inductor compiles the sampler's logprob kernels (`torch.compile`) with the system's C++
compiler against Python's headers: without them the first request asking for logprobs kills the
engine. The connector image's stand-in base (e2e/images/vllm-cpu.Containerfile) installs the
same packages; vLLM's own images have them."""


def _present(need: str) -> bool:
    import ctypes

    if need.endswith(".h"):
        return (Path(sysconfig.get_paths()["include"]) / need).is_file()
    if ".so" in need:
        try:
            ctypes.CDLL(need)
        except OSError:
            return False
        return True
    return shutil.which(need) is not None


def missing_system_needs() -> list[str]:
    """The SYSTEM_NEEDS this machine lacks."""
    return [need for need in SYSTEM_NEEDS if not _present(need)]


def ensure_system_needs() -> None:
    """Installs the missing SYSTEM_NEEDS' packages where that is possible (root, apt-get);
    raises with the package names otherwise."""
    missing = missing_system_needs()
    packages = sorted({SYSTEM_NEEDS[need] for need in missing})
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)
        missing = missing_system_needs()
    if missing:
        raise RuntimeError(
            f"vLLM's CPU engine needs {', '.join(missing)}: install {' '.join(packages)} "
            "(Debian/Ubuntu package names)"
        )


def ensure(route: str | None = None, *, check: bool = False) -> Path | None:
    """The engine venv with this Boomerang linked in; built on first use unless `check`.

    `BOOMERANG_ENGINE_VENV` names a ready venv and skips both steps. With `check`, returns
    None when the venv is not built yet instead of building it."""
    override = os.environ.get("BOOMERANG_ENGINE_VENV")
    if override:
        return Path(override)
    venv = _script(route, check)
    if venv is not None:
        if not check:
            ensure_system_needs()
        link_boomerang(venv)
    return venv


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise RuntimeError(f"no site-packages under {venv}")
    return found[-1]


def _installed() -> md.Distribution:
    """Boomerang as installed into this interpreter's environment.

    Not `md.distribution("boomerang")`: started from a checkout, the working directory is on
    `sys.path`, and the `boomerang.egg-info` that setuptools leaves beside `pyproject.toml` is
    found first; it lists the checkout's sources, not the installed files (the editable finder).
    """
    paths = sysconfig.get_paths()
    places = list(dict.fromkeys([paths["purelib"], paths["platlib"], site.getusersitepackages()]))
    for dist in md.distributions(name="boomerang", path=places):
        return dist
    raise RuntimeError("Boomerang is not installed in this environment (pip install boomerang)")


def _own_files() -> tuple[Path, list[Path], str]:
    """This installation's site-packages, its files there, and a digest of what they are."""
    dist = _installed()
    root = Path(str(dist.locate_file(""))).resolve()
    files = []
    for entry in dist.files or ():
        path = Path(str(dist.locate_file(entry))).resolve()
        if "__pycache__" in path.parts or not path.is_file() or not path.is_relative_to(root):
            continue  # console scripts live outside site-packages; the venv runs `-m` instead
        files.append(path.relative_to(root))
    digest = hashlib.sha256(str(root).encode())
    for rel in sorted(files):
        digest.update(str(rel).encode() + b"\0" + (root / rel).read_bytes())
    return root, sorted(files), digest.hexdigest()


def link_boomerang(venv: Path) -> None:
    """Copy this Boomerang into the venv's site-packages, unless that copy is current."""
    target = site_packages(venv)
    root, files, digest = _own_files()
    record_path = venv / LINK_RECORD
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        record = {}
    if record.get("digest") == digest:
        return
    for rel in record.get("files", []):
        (target / rel).unlink(missing_ok=True)
    for rel in files:
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, dest)
    record_path.write_text(
        json.dumps({"source": str(root), "digest": digest, "files": [str(f) for f in files]})
    )


def engine_command(venv: Path) -> list[str]:
    """How to start an engine from the venv (`boomerang-engine -- <vLLM args>` in images)."""
    return [str(venv / "bin" / "python"), "-m", "boomerang.connector.launch.entrypoint", "--"]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m boomerang.connector.launch.engine_venv")
    p.add_argument("--route", choices=ROUTES, default=None, help="force an install route")
    p.add_argument("--check", action="store_true", help="only report a venv that is built")
    args = p.parse_args(argv)
    try:
        venv = ensure(args.route, check=args.check)
    except RuntimeError as exc:
        print(f"engine_venv: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    if venv is None:
        raise SystemExit(1)
    print(venv)


if __name__ == "__main__":
    main()
