"""buildah as the image builds here use it: storage under the cache, runc, host networking,
and the machine's CA bundle during RUN steps; and the Debian packages it takes.

Why these settings: on the development machines (a Debian 12 container as root, hybrid cgroups,
no image registry) crun refuses the hybrid cgroup layout, so RUN steps go through runc; the
kernel's overlay mounts there, so the overlay driver is the default (vfs copies every layer
whole: BOOMERANG_BUILDAH_DRIVER=vfs where overlay cannot mount); host networking needs no bridge
or iptables; and a TLS-intercepting proxy's CA lives only in the machine's bundle, which RUN
steps see as a read-only bind mount that never reaches an image (BOOMERANG_BUILD_CA_BUNDLE=
turns that off, or names another bundle).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The tools the builds run, and the Debian packages that provide them.
TOOLS = {"buildah": "buildah", "mmdebstrap": "mmdebstrap", "runc": "runc"}
# What importing into a containerd takes (the real-node tests bring their own containerd).
CONTAINERD_TOOLS = {"containerd": "containerd", "ctr": "containerd"}
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
Log = Callable[[str], None]


def missing_tools(tools: dict[str, str] = TOOLS) -> list[str]:
    return [tool for tool in tools if shutil.which(tool) is None]


def install_tools(tools: dict[str, str] = TOOLS, log: Log = print) -> list[str]:
    """Installs the missing `tools` (name -> Debian package) where that is possible (root,
    apt-get); returns what is still missing."""
    missing = missing_tools(tools)
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"images: installing {' '.join(missing)} (apt-get)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        packages = sorted({tools[tool] for tool in missing})
        subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)
    return missing_tools(tools)


class Buildah:
    """buildah with its storage under the cache, runc, host networking and the host's CAs."""

    def __init__(self, root: Path, log: Log = print) -> None:
        self.root = root
        self.log = log
        self.driver = os.environ.get("BOOMERANG_BUILDAH_DRIVER", "overlay")
        self.runtime = os.environ.get("BOOMERANG_BUILDAH_RUNTIME") or shutil.which("runc")
        self.tmp = root / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        ca = os.environ.get("BOOMERANG_BUILD_CA_BUNDLE", HOST_CA_BUNDLE)
        self.ca_bundle = Path(ca) if ca and Path(ca).is_file() else None

    def cmd(self, *args: str) -> list[str]:
        return [
            "buildah",
            "--root",
            str(self.root / "storage" / self.driver),
            "--runroot",
            str(self.root / "run" / self.driver),
            "--storage-driver",
            self.driver,
            *args,
        ]

    @property
    def env(self) -> dict[str, str]:
        # TMPDIR: buildah's temporary copies and its RUN --mount=type=cache folders.
        return {**os.environ, "TMPDIR": str(self.tmp)}

    def run(self, *args: str, capture: bool = False, merge: bool = False) -> str:
        """Runs buildah; with `capture`, returns its stdout (stderr joins it on failure, and
        always with `merge`: a build's RUN steps write to both)."""
        if not capture:
            subprocess.run(self.cmd(*args), check=True, env=self.env)
            return ""
        err = subprocess.STDOUT if merge else subprocess.PIPE
        out = subprocess.run(
            self.cmd(*args), env=self.env, text=True, stdout=subprocess.PIPE, stderr=err
        )
        if out.returncode:
            raise subprocess.CalledProcessError(out.returncode, out.args, out.stdout, out.stderr)
        return out.stdout

    def runtime_args(self) -> list[str]:
        return ["--runtime", self.runtime] if self.runtime else []

    def has(self, ref: str) -> bool:
        cmd = self.cmd("inspect", "--type", "image", ref)
        return subprocess.run(cmd, env=self.env, capture_output=True, check=False).returncode == 0

    def image_id(self, ref: str) -> str:
        return self.run(
            "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref, capture=True
        ).strip()

    def config(self, ref: str) -> dict[str, Any]:
        """The image's OCI config (Entrypoint, Cmd, Env, User, WorkingDir, ...)."""
        image = json.loads(self.run("inspect", "--type", "image", ref, capture=True))
        return dict(image["OCIv1"].get("config") or {})

    def size(self, ref: str) -> str:
        for image in json.loads(self.run("images", "--json", capture=True) or "[]"):
            if ref in (image.get("names") or []):
                return str(image.get("size", "?"))
        return "?"

    def bud(
        self,
        containerfile: Path,
        context: Path,
        tags: list[str],
        build_args: dict[str, str],
        volumes: tuple[str, ...] = (),
        capture: bool = False,
    ) -> str:
        # Docker's image format, as `docker build` makes: in OCI's, buildah ignores SHELL (which
        # the connector's EFA steps need: bash with pipefail).
        args = ["bud", "--format", "docker", "--pull=never", "--network", "host"]
        args += self.runtime_args()
        args += ["-f", str(containerfile)]
        for tag in tags:
            args += ["-t", tag]
        for name, value in sorted(build_args.items()):
            args += ["--build-arg", f"{name}={value}"]
        if self.ca_bundle:
            volumes = (*volumes, f"{self.ca_bundle}:{HOST_CA_BUNDLE}:ro")
        for volume in volumes:
            args += ["--volume", volume]
        return self.run(*args, str(context), capture=capture, merge=capture)

    def run_in(
        self, ref: str, argv: list[str], timeout_s: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """Runs `argv` in a fresh container of the image (its user, workdir and env; no network),
        then removes the container."""
        container = self.run("from", "--pull=never", "--quiet", ref, capture=True).strip()
        if "/" not in argv[0]:
            # buildah looks a bare command up on a PATH of its own, not the image's (it ran
            # /usr/local/bin/python3 where the image's PATH puts /opt/vllm/bin first); a shell
            # in the container looks it up as a container runtime does.
            argv = ["/bin/sh", "-c", 'exec "$@"', "sh", *argv]
        try:
            cmd = self.cmd("run", *self.runtime_args(), "--network", "none", container, "--")
            return subprocess.run(
                [*cmd, *argv], env=self.env, text=True, capture_output=True, timeout=timeout_s
            )
        finally:
            self.run("rm", container, capture=True)
