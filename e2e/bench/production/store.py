"""The production benchmark's results on disk: one small index and one file per regime.

Why split: every run keeps the client's per-request records, so the results of all sittings
together grow past 10 MB, and one file rewritten whole at each publication adds that much to
the repository's history every time. Split by regime (a published regime is one sitting's part:
`production.merge` labels each), a new sitting writes its own files and leaves the others'
bytes alone (the same runs compress to the same bytes: no gzip timestamp), the records take a
tenth of the room compressed, and the index (pooled figures, engine sets, workloads, the
command) stays plain JSON, small enough to read in a review.

    OUT/index.json              everything but the runs, and the files that hold them
    OUT/runs/<regime>.json.gz   that regime's runs and the runs left out of its figures

A folder written before the split (one `production.json`) still loads. Pure apart from
`load`/`save`.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

INDEX = "index.json"
LEGACY = "production.json"
_RUN_KEYS = ("runs", "excluded_runs")


def slug(regime: str) -> str:
    """A file name for a regime's label (`agentic, equal engines` -> `agentic-equal-engines`)."""
    name = re.sub(r"[^a-z0-9]+", "-", regime.lower()).strip("-")
    if not name:
        raise ValueError(f"regime {regime!r} has no letter or digit to name its file by")
    return name


def split(res: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The index and the run files (file name -> content) of one set of results."""
    index = {k: v for k, v in res.items() if k not in _RUN_KEYS}
    files: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}  # regime -> file name, in the order regimes first appear
    for key in _RUN_KEYS:
        for run in res.get(key, []):
            name = names.setdefault(run["regime"], f"{slug(run['regime'])}.json.gz")
            files.setdefault(name, {k: [] for k in _RUN_KEYS})[key].append(run)
    taken: dict[str, str] = {}
    for regime, name in names.items():
        if taken.setdefault(name, regime) != regime:
            raise ValueError(f"regimes {taken[name]!r} and {regime!r} would share {name}")
    index["run_files"] = list(files)
    if "excluded_runs" in res:
        index["excluded_serials"] = [r["serial"] for r in res["excluded_runs"]]
    return index, files


def join(index: Mapping[str, Any], files: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`split`'s inverse: runs by serial, the runs left out in the order they were left out."""
    res = {k: v for k, v in index.items() if k not in ("run_files", "excluded_serials")}
    runs = [r for name in index["run_files"] for r in files[name]["runs"]]
    res["runs"] = sorted(runs, key=lambda r: r["serial"])
    if "excluded_serials" in index:
        left_out = {r["serial"]: r for n in index["run_files"] for r in files[n]["excluded_runs"]}
        res["excluded_runs"] = [left_out[s] for s in index["excluded_serials"]]
    return res


def load(path: Path) -> dict[str, Any]:
    """The results in folder `path` (split, or one legacy `production.json`), or in the one
    file `path` names."""
    if path.is_file():
        return dict(json.loads(path.read_text()))
    if not (path / INDEX).exists() and (path / LEGACY).exists():
        return dict(json.loads((path / LEGACY).read_text()))
    index = json.loads((path / INDEX).read_text())
    files = {
        name: json.loads(gzip.decompress((path / "runs" / name).read_bytes()))
        for name in index["run_files"]
    }
    return join(index, files)


def save(path: Path, res: Mapping[str, Any]) -> None:
    """Write `res` split into folder `path`; run files no regime names any more are removed,
    so that the folder holds exactly what the index lists."""
    index, files = split(res)
    runs = path / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        text = json.dumps(content, separators=(",", ":")).encode()
        (runs / name).write_bytes(gzip.compress(text, mtime=0))
    for stale in runs.glob("*.json.gz"):
        if stale.name not in files:
            stale.unlink()
    (path / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    (path / LEGACY).unlink(missing_ok=True)
