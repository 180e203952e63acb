"""Several sittings published as one: a later sitting's runs added to the published results.

Why: a sitting of every regime and mode takes hours on two cores, so the published results
grow by parts: a regime of the sweep run on its own, or a regime run again on a later router.
Each part keeps what tells it apart, so that runs of different sittings are never read as one
set: every run carries its sitting's date and commit (`revision`), its regime may be renamed
(`2p1d, router 9c6eec2`: a label shown in every table), its serial is moved past the serials
already published (a serial names one run), and its engine sets, workload and command are kept.
The figures are then pooled again from the runs.

What the results hold of the machine that ran them: only the command's `--out` folder (the
engines' commands name relative paths). The published command drops it, and a result that
still names a path of this machine is refused rather than committed. Pure apart from
`load_part`.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.harness.repo import REPO
from bench.production import report, store

_OUT = re.compile(r" --out [^\s\"]+")
_MAKE = "make bench-production "


def parse_part(spec: str) -> tuple[str | None, Path]:
    """`LABEL=PATH` (the part's one regime renamed LABEL, or each regime R renamed LABEL with
    `{regime}` in it replaced by R) or `PATH` (regimes as they ran).
    The label ends at the first `=`: a path may hold one, a label may not."""
    label, sep, path = spec.partition("=")
    if not sep:
        label, path = "", spec
    if not path:
        raise ValueError(f"--merge {spec!r}: no results file named")
    return label or None, Path(path)


def load_part(path: Path) -> dict[str, Any]:
    """A sitting's results: its folder (`store`), or one results file."""
    return store.load(path)


def merge(base: Mapping[str, Any], part: Mapping[str, Any], label: str | None) -> dict[str, Any]:
    """`base` with `part`'s runs added (neither is changed). Raises ValueError where the part
    cannot be told apart: a label for a part of several regimes, or a regime already
    published under that name."""
    regimes = list(part["pooled"])
    if label is not None and "{regime}" not in label and len(regimes) != 1:
        raise ValueError(
            f"a label names one regime ('{{regime}}' in it names each); this part ran "
            f"{', '.join(regimes)}"
        )
    name = {r: label.replace("{regime}", r) if label else r for r in regimes}
    taken = set(base["pooled"]) & set(name.values())
    if taken:
        raise ValueError(f"already published: {', '.join(sorted(taken))} (give a label)")
    out = copy.deepcopy(dict(base))
    published = out["runs"] + out.get("excluded_runs", [])
    offset = (max((r["serial"] for r in published), default=0) // 100 + 1) * 100
    for key in ("runs", "excluded_runs"):  # an excluded run stays excluded, and shown
        for run in copy.deepcopy(part.get(key, [])):
            run["seed_serial"] = run.get("seed_serial", run["serial"])
            run["serial"] += offset
            run["regime"] = name[run["regime"]]
            run.setdefault("date", part.get("date"))
            run.setdefault("revision", part.get("revision"))
            out.setdefault(key, []).append(run)
    for engine_set in copy.deepcopy(part["engine_sets"]):
        engine_set["regime"] = name[engine_set["regime"]]
        out["engine_sets"].append(engine_set)
    for regime, workload in part["workloads"].items():
        out["workloads"][name[regime]] = workload
    for key in ("peers", "twin"):  # the equal-engine comparison's modes, where the part ran it
        if part.get(key) and not out.get(key):
            out[key] = copy.deepcopy(part[key])
    base_command = _OUT.sub("", str(base["command"]))
    out["command"] = f"{base_command}; then {', '.join(name.values())}: {command(part)}"
    if part.get("date") and part["date"] not in str(base.get("date", "")):
        out["date"] = f"{base.get('date')} and {part['date']}"
    if str(part["rounds"]) != str(base["rounds"]).split(" ", 1)[0].rstrip(";"):
        # The base's rounds may already say where they differ ("5 (agentic's stock modes: 3)").
        out["rounds"] = f"{base['rounds']}; {', '.join(name.values())}: {part['rounds']}"
    if part.get("revision") != base.get("revision"):
        out.pop("revision", None)  # each run names its own
    out["pooled"] = report.pooled_by_regime(out["runs"])
    return out


def command(part: Mapping[str, Any]) -> str:
    """The part's command as published: the `ARGS=...` a reader passes to the make target,
    without the folder it was written to."""
    return _OUT.sub("", str(part["command"])).removeprefix(_MAKE)


def machine_paths(text: str, roots: Iterable[Path]) -> list[str]:
    """Where `text` names a path under one of `roots` (a few characters around each)."""
    hits = []
    for root in roots:
        for m in re.finditer(re.escape(str(root).rstrip("/") + "/"), text):
            hits.append(text[max(0, m.start() - 40) : m.end() + 40])
    return hits


def merged(base: Mapping[str, Any], parts: Iterable[str]) -> dict[str, Any]:
    """`base` with every `LABEL=PATH` part merged in order; refused if the result names a path
    of this machine (home, temporary folder, the repository)."""
    out = dict(base)
    for spec in parts:
        label, path = parse_part(spec)
        out = merge(out, load_part(path), label)
    text = json.dumps(out)
    if hits := machine_paths(text, (Path.home(), Path(tempfile.gettempdir()), REPO)):
        raise ValueError(f"the merged results name paths of this machine: {hits[:3]}")
    return out
