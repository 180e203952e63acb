"""What the engine image's build checks of NIXL: one backend, the one the base's CUDA needs.

Why: NIXL's PyPI package `nixl` is only a loader; it imports `nixl_cu12` or `nixl_cu13` by the
CUDA major of the process's torch. vLLM's image already carries NIXL, and installing the wrong
backend over it (or a loader of another version) leaves an image whose engine logs "NIXL is not
available" at start, on a GPU node, long after the build. So `connector/Dockerfile` asks this
module which backend to install (`backend`), narrows the loader's declared requirements to it
(`narrow`: the loader requires both backends, though it loads one), and then runs `check`, which
fails the build unless:

- exactly one backend is installed, the one for torch's CUDA major, at the loader's version;
- `nixl._api` imports and picked that backend, and NIXL finds its UCX and LIBFABRIC plugins;
- every library NIXL's LIBFABRIC plugin (the EFA transport) links resolves: through the
  system's search path (libfabric, hwloc), or as a library torch has already loaded in the
  process (the CUDA runtime), except the GPU driver's `libcuda.so.1`, which the NVIDIA container
  runtime mounts from the host at run time (so LIBFABRIC itself can only load on a GPU node; on
  a CPU stand-in base, whose torch has no CUDA, the CUDA runtime is not asked for either); and
  each has the symbol versions the plugin needs: `readelf -V` of the plugin against
  `readelf -V` of the libfabric.so.1 it resolves (nixl 1.5.1's needs `FABRIC_1.10`, first
  defined by libfabric 2.7, which AWS's EFA installer ships from 1.51.0; Debian's and Ubuntu's
  libfabric1 are older: with `--libfabric distribution` that is reported, not failed, and the
  image serves UCX only);
- NIXL loads the LIBFABRIC plugin where it can (its memory types come from the loaded library),
  and the check tries to create the backend as the engine does. Without an EFA device (any
  build, any node without EFA) libfabric's efa provider finds no NIC and creation fails: that
  is said, with why, not failed; `--require-libfabric-backend` (on an EFA node) fails on it;
- Boomerang's NIXL patch (`nixl_quiet`) applies to this NIXL, and `pip check` finds no broken
  requirement the build added to its base (it prints the base's own, and the operator's and
  router's packages, which the image leaves out of Boomerang's install on purpose).

Run in an image: `python3 -m boomerang.connector.launch.image_check [backend|narrow|check]
[--libfabric efa-installer|distribution] [--require-libfabric-backend]`.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

LOADER = "nixl"
BACKENDS = ("nixl-cu12", "nixl-cu13")
CPU_BACKEND = "nixl-cu12"
"""For a torch without CUDA (the CPU stand-in base): the build install-engine.sh takes."""
HOST_PROVIDED = frozenset({"libcuda.so.1"})
"""Libraries the container runtime mounts from the host at run time (the GPU driver's)."""
CUDA_RUNTIME = "libcudart.so."
LIBFABRIC_PLUGIN = "libplugin_LIBFABRIC.so"
LIBFABRIC_SONAME = "libfabric.so.1"
RDMA_DEVICES = Path("/sys/class/infiniband")
"""Where the kernel lists RDMA devices (an EFA NIC is one); empty or absent: no EFA here."""
REQUIRED_PLUGINS = ("UCX", "LIBFABRIC")
BASE_PIP_CHECK = Path("/usr/local/share/boomerang/base-pip-check.txt")
"""`pip check` of the base image, written by the Dockerfile's first step."""
OWN = "boomerang"
"""Installed without its dependencies on purpose: the engine imports none of the operator's
and router's (kopf, kubernetes, redis, ...), so `pip check` reports them and nothing else."""


def backend(cuda: str | None) -> str:
    """The NIXL backend distribution for torch's `torch.version.cuda` ("13.0" -> nixl-cu13)."""
    if not cuda:
        return CPU_BACKEND
    name = f"nixl-cu{cuda.split('.')[0]}"
    if name not in BACKENDS:
        raise ValueError(f"no NIXL backend for CUDA {cuda} (NIXL publishes {BACKENDS})")
    return name


def module_of(distribution: str) -> str:
    return distribution.replace("-", "_")


def install_problems(installed: Mapping[str, str], expected: str) -> list[str]:
    """What is wrong with the installed NIXL distributions (name -> version)."""
    loader = installed.get(LOADER)
    if loader is None:
        return [f"the {LOADER} loader is not installed"]
    problems = []
    if expected not in installed:
        problems.append(f"{expected} (for torch's CUDA) is not installed")
    elif installed[expected] != loader:
        problems.append(f"{expected} is {installed[expected]}, the {LOADER} loader {loader}")
    problems += [
        f"{other} {installed[other]} is installed too (one backend only: {expected})"
        for other in BACKENDS
        if other != expected and other in installed
    ]
    return problems


def narrowed(metadata: str, keep: str) -> str:
    """The loader's METADATA declaring only the backend the image keeps, as NIXL's own
    single-backend builds declare it (the PyPI loader requires both, loads one). Only the
    header changes (the description after its first blank line is left as it is)."""
    drop = [b for b in BACKENDS if b != keep]
    header, blank, body = metadata.partition("\n\n")
    pattern = re.compile(rf"^Requires-Dist: ({'|'.join(map(re.escape, drop))})\b.*(\n|$)", re.M)
    return pattern.sub("", header + "\n").removesuffix("\n") + blank + body


def unresolved(ldd_output: str, loaded: Iterable[str], cuda: str | None) -> list[str]:
    """The libraries `ldd` did not find that nothing will provide at run time: neither a
    library already loaded in the process (by soname), nor the host's driver, nor (on a torch
    without CUDA, where LIBFABRIC cannot run anyway) the CUDA runtime."""
    provided = HOST_PROVIDED | set(loaded)
    missing = re.findall(r"^\s*(\S+) => not found", ldd_output, re.M)
    return [
        lib for lib in missing if lib not in provided and (cuda or not lib.startswith(CUDA_RUNTIME))
    ]


def missing_versions(ldd_output: str) -> list[str]:
    """The symbol versions a library lacks, from `ldd`'s complaints (`libfabric.so.1: version
    'FABRIC_1.10' not found`): the library is found, but too old for the plugin."""
    found = re.findall(r"(\S+): version `([^']+)' not found \(required by", ldd_output)
    return sorted({f"{Path(lib).name} {version}" for lib, version in found})


def _sections(readelf: str) -> dict[str, list[str]]:
    """`readelf -V`'s lines by section: `symbols`, `definition`, `needs`."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in readelf.splitlines():
        header = re.match(r"Version (symbols|definition|needs) section", line)
        if header:
            current = found.setdefault(header.group(1), [])
        else:
            current.append(line)
    return found


def needed_versions(readelf: str) -> dict[str, set[str]]:
    """The symbol versions a binary needs, per library (`readelf -V`'s `.gnu.version_r`)."""
    needs: dict[str, set[str]] = {}
    library = None
    for line in _sections(readelf).get("needs", []):
        if file := re.search(r"\bFile: (\S+)", line):
            library = file.group(1)
            needs.setdefault(library, set())
        elif (name := re.search(r"\bName: (\S+)", line)) and library is not None:
            needs[library].add(name.group(1))
    return needs


def defined_versions(readelf: str) -> set[str]:
    """The symbol versions a library defines (`.gnu.version_d`), less its BASE entry (which
    names the library itself)."""
    return {
        name.group(1)
        for line in _sections(readelf).get("definition", [])
        if "Flags: BASE" not in line and (name := re.search(r"\bName: (\S+)", line))
    }


def lacking_versions(plugin: str, library: str, soname: str = LIBFABRIC_SONAME) -> list[str]:
    """What `soname` lacks of the versions the plugin needs from it, from both `readelf -V`
    outputs, as `libfabric.so.1 FABRIC_1.10` (in version order)."""
    missing = needed_versions(plugin).get(soname, set()) - defined_versions(library)
    return [f"{soname} {v}" for v in sorted(missing, key=_version_key)]


def _version_key(version: str) -> tuple[str, tuple[int, ...]]:
    """FABRIC_1.9 before FABRIC_1.10."""
    prefix, _, number = version.rpartition("_")
    return prefix, tuple(int(n) for n in re.findall(r"[0-9]+", number))


def backend_failure(message: str, rdma_devices: Iterable[str]) -> str:
    """Why NIXL could not create its LIBFABRIC backend here, in words: most often that there is
    no EFA device (a build, a node without EFA), which is expected and no fault of the image."""
    if "libcuda.so.1" in message:
        return f"the GPU driver's libcuda.so.1 is mounted only on a GPU node ({message})"
    if "FABRIC_" in message and "not found" in message:
        return f"libfabric.so.1 is too old for the plugin ({message})"
    if not list(rdma_devices):
        return (
            "no EFA device here (no RDMA device in /sys/class/infiniband): libfabric's efa "
            f"provider finds no NIC, so the backend cannot initialise ({message})"
        )
    return message


def loaded_sonames(maps: str) -> set[str]:
    """The shared libraries mapped in a process (`/proc/<pid>/maps`), by file name."""
    return {Path(line.split()[-1]).name for line in maps.splitlines() if ".so" in line}


# --- in the image ------------------------------------------------------------------------------


def torch_cuda() -> str | None:
    import torch

    return getattr(torch.version, "cuda", None)


def installed_nixl() -> dict[str, str]:
    found = {}
    for name in (LOADER, *BACKENDS):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return found


def plugin_file(distribution: str, name: str) -> Path | None:
    for file in md.distribution(distribution).files or ():
        if file.name == name:
            return Path(str(file.locate()))
    return None


def narrow() -> Path:
    """Rewrite the installed loader's METADATA to require only the backend for torch's CUDA."""
    keep = backend(torch_cuda())
    path = Path(str(md.distribution(LOADER).locate_file(f"nixl-{md.version(LOADER)}.dist-info")))
    metadata = path / "METADATA"
    metadata.write_text(narrowed(metadata.read_text(), keep))
    return metadata


def check(libfabric: str = "efa-installer", require_backend: bool = False) -> list[str]:
    """Every check of the module docstring; prints what it found, returns the problems.
    `libfabric` is where the image's libfabric came from (the Dockerfile's LIBFABRIC);
    `require_backend`: the LIBFABRIC backend must be created (on a node with EFA)."""
    cuda = torch_cuda()
    expected = backend(cuda)
    installed = installed_nixl()
    print(f"image: torch CUDA {cuda}; NIXL {installed}; expected backend {expected}")
    problems = install_problems(installed, expected) + load_problems(expected, require_backend)
    for name in BACKENDS:
        if name in installed:
            problems += libfabric_problems(name, cuda, strict=libfabric != "distribution")
    pip = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    base = BASE_PIP_CHECK.read_text() if BASE_PIP_CHECK.is_file() else ""
    broken, own, inherited = pip_check_findings(pip.stdout + pip.stderr, base)
    if own:
        print(f"image: pip check: {OWN} installed without its operator and router packages: {own}")
    if inherited:
        print(f"image: pip check: the base's own, before this build: {inherited}")
    problems += [f"pip check: {line}" for line in broken]
    if pip.returncode and not (broken or own or inherited):
        problems.append(f"pip check exited {pip.returncode}")
    if not broken:
        print("image: pip check: no broken requirement added to the base")
    return problems


def pip_check_findings(output: str, base: str = "") -> tuple[list[str], list[str], list[str]]:
    """`pip check`'s lines: those this build broke; the requirements of Boomerang's own
    distribution left out on purpose (by package name); and those the base had already
    (`BASE_PIP_CHECK`, written before the build changed anything)."""
    before = {line.strip() for line in base.splitlines()}
    broken, own, inherited = [], [], []
    for line in output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        match = re.fullmatch(rf"{OWN} \S+ requires (\S+), which is not installed\.", line)
        if match:
            own.append(match.group(1))
        elif line in before:
            inherited.append(line)
        else:
            broken.append(line)
    return broken, own, inherited


def load_problems(expected: str, require_backend: bool = False) -> list[str]:
    """NIXL as vLLM loads it (`nixl._api`): the backend it picks, the plugins it finds, and the
    LIBFABRIC backend as the engine creates it (`libfabric_backend`)."""
    try:
        import nixl
        import nixl._api as api

        picked = str(nixl._pkg.__name__)
        config = api.nixl_agent_config(enable_prog_thread=False, backends=[])
        agent = api.nixl_agent("image-check", config)
        plugins = sorted(agent.get_plugin_list())
    except Exception as exc:  # any failure to load NIXL is the finding
        return [f"NIXL does not load: {type(exc).__name__}: {exc}"]
    print(f"image: nixl._api from {picked}; the plugins NIXL finds: {', '.join(plugins)}")
    problems = [f"NIXL has no {p} plugin" for p in REQUIRED_PLUGINS if p not in plugins]
    if picked != module_of(expected):
        problems.append(f"nixl loaded {picked}, not {module_of(expected)}")
    if "LIBFABRIC" in plugins:
        problems += libfabric_backend(agent, require_backend)
    from boomerang.connector.plugin import nixl_quiet

    if not nixl_quiet.apply():
        problems.append("Boomerang's NIXL patch (nixl_quiet) does not apply to this NIXL")
    return problems


def libfabric_backend(agent: Any, required: bool) -> list[str]:
    """Load NIXL's LIBFABRIC plugin and create its backend, as the engine does; say what
    happened and why. Without an EFA device the backend cannot be created (libfabric's efa
    provider finds no NIC): a problem only when `required`."""
    mems = agent.get_plugin_mem_types("LIBFABRIC")
    if mems:
        print(f"image: NIXL loaded its LIBFABRIC plugin (memory types {', '.join(mems)})")
    else:
        print("image: NIXL lists LIBFABRIC but reports no memory types for it (not loaded)")
    try:
        agent.create_backend("LIBFABRIC", {})
    except Exception as exc:  # NIXL raises its own error types; the message is the finding
        devices = sorted(d.name for d in RDMA_DEVICES.glob("*")) if RDMA_DEVICES.is_dir() else []
        why = backend_failure(f"{type(exc).__name__}: {exc}", devices)
        if required:
            return [f"NIXL cannot create its LIBFABRIC backend: {why}"]
        print(f"image: NIXL's LIBFABRIC backend not created here: {why}")
        return []
    created = ", ".join(agent.get_backend_mem_types("LIBFABRIC"))
    print(f"image: NIXL created its LIBFABRIC backend (memory types {created})")
    return []


def libfabric_problems(distribution: str, cuda: str | None, strict: bool) -> list[str]:
    """`ldd` on a backend's LIBFABRIC plugin, in this process (torch loaded), then `readelf -V`
    of the plugin against the libfabric.so.1 `ldd` resolved. A library too old for the plugin (a
    missing symbol version) fails only when `strict`: the image is meant to use LIBFABRIC (AWS's
    EFA installer); with the distribution's libfabric it serves UCX."""
    plugin = plugin_file(distribution, LIBFABRIC_PLUGIN)
    if plugin is None:
        return [f"{distribution} has no {LIBFABRIC_PLUGIN}"]
    ldd = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=False)
    loaded = loaded_sonames(Path("/proc/self/maps").read_text())
    found = re.findall(r"^\s*(lib(?:fabric|hwloc|cudart)\S*) => (/\S+)", ldd.stdout, re.M)
    links = ", ".join(f"{lib} ({path})" for lib, path in found) or "none of libfabric, hwloc"
    print(f"image: {distribution} {plugin.name} resolves {links}")
    problems = [
        f"{distribution} {plugin.name} links {lib}: not found, and nothing provides it at run time"
        for lib in unresolved(ldd.stdout, loaded, cuda)
    ]
    library = dict(found).get(LIBFABRIC_SONAME)
    if library is None:
        return problems
    try:
        too_old = lacking_versions(readelf(plugin), readelf(Path(library)))
    except OSError as exc:  # no readelf (binutils), or it failed on a file
        problems.append(f"cannot compare symbol versions with readelf: {exc}")
        too_old = missing_versions(ldd.stdout + ldd.stderr)
    else:
        print(
            f"image: readelf: {library} defines every symbol version {plugin.name} needs"
            if not too_old
            else f"image: readelf: {library} lacks {', '.join(too_old)}"
        )
    if too_old:
        what = (
            f"{distribution} {plugin.name} needs {', '.join(too_old)}, which this libfabric lacks"
        )
        if strict:
            problems.append(what)
        else:
            print(f"image: {what}: LIBFABRIC cannot load with it, this image serves UCX only")
    return problems


def readelf(path: Path) -> str:
    """`readelf -V` of a binary (OSError when readelf is missing or fails)."""
    out = subprocess.run(["readelf", "-V", "--wide", str(path)], capture_output=True, text=True)
    if out.returncode:
        raise OSError(f"readelf -V {path} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    commands = ("backend", "narrow", "check")
    parser.add_argument("command", nargs="?", default="check", choices=commands)
    parser.add_argument(
        "--require-libfabric-backend",
        action="store_true",
        help="fail unless NIXL creates its LIBFABRIC backend (on a node with EFA devices)",
    )
    parser.add_argument(
        "--libfabric",
        default="efa-installer",
        choices=("efa-installer", "distribution"),
        help="where the image's libfabric came from (distribution: LIBFABRIC may not load)",
    )
    args = parser.parse_args(argv)
    if args.command == "backend":
        print(backend(torch_cuda()))
        return 0
    if args.command == "narrow":
        print(f"image: {narrow()} requires {backend(torch_cuda())} only")
        return 0
    problems = check(args.libfabric, args.require_libfabric_backend)
    for problem in problems:
        print(f"image check failed: {problem}", file=sys.stderr)
    if not problems:
        print("image: NIXL checks passed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
