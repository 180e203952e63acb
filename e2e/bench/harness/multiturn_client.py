"""vLLM's own multi-turn benchmark client, fetched at run time and run against any endpoint.

Why: a benchmark that claims to beat the production baseline must be measured by a client
nobody here wrote. vLLM ships one (`benchmarks/multi_turn/benchmark_serving_multi_turn.py`) in
its source distribution, not in its wheel. This module fetches that sdist at a pinned version
from the package index pip is configured with (never a copy in this repository), checks it
against the index's SHA-256, unpacks only the `benchmarks/multi_turn/` folder into the cache
(`$BOOMERANG_CACHE/vllm-multi-turn-<version>/`), and builds a small virtualenv for it from the
folder's own `requirements.txt` (cached, keyed by that file). The client's one import of vLLM
itself (`vllm.benchmarks.lib.utils.redact_sensitive_namespace`, for a log line) is answered by
a stand-in written here, so the client needs no vLLM install.

    python multiturn_client.py [--version V]     # fetch and build, print the client's folder
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
import venv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "0.34.0"
"""The vLLM release whose multi-turn client the benchmarks run (the newest one here)."""
FOLDER = "benchmarks/multi_turn/"
SCRIPT = "benchmark_serving_multi_turn.py"
PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"
PROXY_FILE = "toy_proxy_server.py"
"""Where the proxy lands in the client's folder."""
PROXY_REQUIREMENTS = ("fastapi", "uvicorn", "httpx")
"""What the proxy imports (it has no requirements file of its own)."""
DONE = ".complete-2"
"""Written once the folder is complete (`-2`: the proxy joined the client)."""
SKIP_REQUIREMENTS = ("xlsxwriter",)
"""Only needed for `--excel-output`, which the benchmarks never pass."""
STAND_IN = '''"""Stands in for the one vLLM helper the multi-turn client imports."""


def redact_sensitive_namespace(namespace, fields):
    values = dict(vars(namespace))
    for name in fields:
        if values.get(name) is not None:
            values[name] = "<redacted>"
    return values
'''


@dataclass(frozen=True)
class Client:
    """The fetched client: its folder, and the Python that runs it."""

    folder: Path
    python: Path

    @property
    def script(self) -> Path:
        return self.folder / SCRIPT

    @property
    def proxy(self) -> Path:
        return self.folder / PROXY_FILE

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The client's environment: its folder and the stand-in first on the path, offline."""
        path = [str(self.folder), str(self.folder / "stand-in")]
        if base.get("PYTHONPATH"):
            path.append(base["PYTHONPATH"])
        return {
            **base,
            "PYTHONPATH": os.pathsep.join(path),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }


def cache_root(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get("BOOMERANG_CACHE") or Path.home() / ".cache" / "boomerang")


def index_url(env: Mapping[str, str] = os.environ) -> str:
    """The simple index pip uses here: PIP_INDEX_URL, else pip's configuration, else pip's own
    default (read from pip, so that no registry's name is written in this repository)."""
    if env.get("PIP_INDEX_URL"):
        return env["PIP_INDEX_URL"].rstrip("/")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip().rstrip("/")
    from pip._internal.models.index import PyPI

    return str(PyPI.simple_url).rstrip("/")


class _Links(html.parser.HTMLParser):
    """The anchors of a PEP 503 simple page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def sdist_of(page: bytes, content_type: str, version: str, base: str) -> tuple[str, str]:
    """The sdist's URL and SHA-256 for `version` from a simple-index page (PEP 691 JSON or
    PEP 503 HTML); ValueError when the page lists none with a SHA-256."""
    name = f"vllm-{version}.tar.gz"
    if "json" in content_type:
        for f in json.loads(page).get("files", []):
            if f.get("filename") == name and f.get("hashes", {}).get("sha256"):
                return urllib.parse.urljoin(base, f["url"]), f["hashes"]["sha256"]
    else:
        parser = _Links()
        parser.feed(page.decode("utf-8", "replace"))
        for text, href in parser.links:
            url, _, fragment = href.partition("#")
            if text == name and fragment.startswith("sha256="):
                return urllib.parse.urljoin(base, url), fragment.removeprefix("sha256=")
    raise ValueError(f"the index lists no {name} with a sha256")


def multi_turn_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The regular files of the sdist's `benchmarks/multi_turn/` folder (paths stay inside)."""
    out = []
    for member in tar.getmembers():
        _, _, inner = member.name.partition("/")
        if member.isfile() and inner.startswith(FOLDER) and ".." not in Path(inner).parts:
            out.append(member)
    return out


def proxy_member(tar: tarfile.TarFile) -> tarfile.TarInfo:
    """vLLM's toy P/D proxy for the NixlConnector (`PROXY`), the baseline a user copying vLLM's
    example runs."""
    for member in tar.getmembers():
        if member.isfile() and member.name.partition("/")[2] == PROXY:
            return member
    raise RuntimeError(f"the sdist has no {PROXY}")


def _get(url: str, accept: str = "*/*") -> tuple[bytes, str]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def fetch(version: str = VERSION, cache: Path | None = None) -> Path:
    """The client's folder for `version`, fetched and checked once (cached)."""
    folder = (cache or cache_root()) / f"vllm-multi-turn-{version}"
    if (folder / DONE).exists():
        return folder
    base = index_url() + "/vllm/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    page, kind = _get(base, accept)
    url, sha256 = sdist_of(page, kind, version, base)
    raw, _ = _get(url)
    if hashlib.sha256(raw).hexdigest() != sha256:
        raise RuntimeError(f"vllm-{version}.tar.gz does not match the index's sha256")
    shutil.rmtree(folder, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for member in multi_turn_members(tar):
            target = folder / Path(member.name.partition("/")[2]).relative_to(FOLDER)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
        proxy = tar.extractfile(proxy_member(tar))
        assert proxy is not None
        (folder / PROXY_FILE).write_bytes(proxy.read())
    if not (folder / SCRIPT).exists():
        raise RuntimeError(f"vllm-{version}'s sdist has no {FOLDER}{SCRIPT}")
    stand_in = folder / "stand-in" / "vllm" / "benchmarks" / "lib"
    stand_in.mkdir(parents=True)
    for pkg in (stand_in.parent.parent, stand_in.parent, stand_in):
        (pkg / "__init__.py").write_text("")
    (stand_in / "utils.py").write_text(STAND_IN)
    (folder / DONE).write_text(json.dumps({"version": version, "sha256": sha256}))
    return folder


def requirements(folder: Path) -> list[str]:
    lines = (folder / "requirements.txt").read_text().splitlines()
    reqs = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    return [r for r in reqs if not r.lower().startswith(SKIP_REQUIREMENTS)]


def client_python(folder: Path, cache: Path | None = None) -> Path:
    """A virtualenv with the client's and the proxy's requirements (cached, keyed by them)."""
    reqs = [*requirements(folder), *PROXY_REQUIREMENTS]
    key = hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:12]
    home = (cache or cache_root()) / f"venv-multi-turn-{key}"
    python = home / "bin" / "python"
    if (home / DONE).exists():
        return python
    shutil.rmtree(home, ignore_errors=True)
    venv.create(home, with_pip=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *reqs], check=True)
    (home / DONE).write_text("\n".join(reqs))
    return python


def ensure(version: str = VERSION) -> Client:
    folder = fetch(version)
    return Client(folder, client_python(folder))


GENERATE = """
import json, random, sys
import numpy as np
from transformers import AutoTokenizer
from bench_dataset import conversations_dict_to_list, generate_conversations, parse_input_json_file
config, model, seed, prefix, out = sys.argv[1:6]
random.seed(int(seed))
np.random.seed(int(seed))
tokenizer = AutoTokenizer.from_pretrained(model)
with open(config) as f:
    conversations = generate_conversations(parse_input_json_file(json.load(f)), tokenizer)
listed = conversations_dict_to_list(conversations)
for item in listed:
    item["id"] = prefix + item["id"]
with open(out, "w") as f:
    json.dump(listed, f)
"""
"""The client's own generator, seeded as its main() seeds it, run once so that the benchmark
knows every turn it should see (the client gives up a failed client's remaining turns without
a record), with conversation ids unique per run (the generator names them alike every time)."""


def generate(
    client: Client, *, config: Mapping[str, Any], model_dir: Path, seed: int, prefix: str,
    workdir: Path,
) -> list[dict[str, Any]]:  # fmt: skip
    """The conversations of `config` (the client's generator JSON, `text_files` relative to
    `workdir`) as the client's list input: `[{"id", "messages"}]`."""
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "generator.json"
    conf.write_text(json.dumps(config))
    out = workdir / "conversations.json"
    cmd = [str(client.python), "-c", GENERATE, str(conf), str(model_dir), str(seed), prefix,
           str(out)]  # fmt: skip
    with open(workdir / "generate.log", "wb") as log:
        subprocess.run(
            cmd, cwd=workdir, env=client.env(os.environ), stdout=log, stderr=log, check=True
        )
    listed: list[dict[str, Any]] = json.loads(out.read_text())
    return listed


def expected_turns(conversations: Sequence[Mapping[str, Any]]) -> int:
    """The requests the client sends for these conversations: one per user message."""
    return sum(1 for c in conversations for m in c["messages"] if m.get("role") == "user")


DONE_LINE = re.compile(r"num_successes=(\d+), num_failures=(\d+)")


def answered(log_text: str) -> int | None:
    """How many turns the client's processes say they completed (each logs
    `num_successes=N, num_failures=M` when it is done); None when none said. The client gathers
    its per-request records through a multiprocessing queue that it drains while `empty()` is
    false, which can leave a record behind: a turn answered but not recorded is not lost."""
    found = DONE_LINE.findall(log_text)
    return sum(int(ok) for ok, _ in found) if found else None


def run(
    client: Client,
    *,
    url: str,
    model_dir: Path,
    served_name: str,
    config: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    clients: int,
    seed: int,
    workdir: Path,
    timeout_s: float,
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One run of the client: `config` is its conversation generator's JSON (its
    `text_files` relative to `workdir`) or a list of conversations (`generate`); returns its
    per-request records."""
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "client-input.json"
    conf.write_text(json.dumps(config))
    stats = workdir / "requests.json"
    stats.unlink(missing_ok=True)
    cmd = [
        str(client.python), str(client.script),
        "--input-file", str(conf), "--model", str(model_dir),
        "--served-model-name", served_name, "--url", url,
        "--num-clients", str(clients), "--seed", str(seed),
        "--no-early-stop", "--request-timeout-sec", str(int(timeout_s)),
        "--stats-json-output", str(stats), *extra,
    ]  # fmt: skip
    with open(workdir / "client.log", "wb") as log:
        done = subprocess.run(
            cmd, cwd=workdir, env=client.env(os.environ), stdout=log, stderr=log, check=False
        )
    # A client that failed still counts: what it recorded is kept, what it lost is lost turns
    # (the caller compares with the turns it expected), and its log says why.
    if done.returncode != 0:
        print(f"  client exited {done.returncode}: {workdir / 'client.log'}", flush=True)
    if not stats.exists():
        return []
    records: list[dict[str, Any]] = json.loads(stats.read_text())
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default=VERSION)
    args = ap.parse_args()
    client = ensure(args.version)
    print(client.folder)


if __name__ == "__main__":
    main()
