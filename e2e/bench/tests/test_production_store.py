"""The production results on disk (`bench.production.store`): an index and one compressed file
of runs per regime, read back exactly, the published folder included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.harness.repo import RESULTS
from bench.production import report, store


def run(regime: str, serial: int) -> dict[str, Any]:
    return {"regime": regime, "mode": "adaptive", "serial": serial, "records": [{"ttft_ms": 1.0}]}


def results() -> dict[str, Any]:
    return {
        "date": "2026-12-07",
        "pooled": {"spare": {}, "agentic, equal engines": {}},
        "runs": [run("spare", 1), run("agentic, equal engines", 2), run("spare", 3)],
        "excluded_runs": [run("spare", 9), run("agentic, equal engines", 4)],
    }


def test_a_sitting_splits_by_regime_and_reads_back_exactly(tmp_path: Path) -> None:
    store.save(tmp_path, results())
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["run_files"] == ["spare.json.gz", "agentic-equal-engines.json.gz"]
    assert "runs" not in index and "excluded_runs" not in index
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(index["run_files"])
    assert store.load(tmp_path) == results()  # runs by serial, left-out runs in their order


def test_unchanged_runs_are_written_as_the_same_bytes(tmp_path: Path) -> None:
    store.save(tmp_path, results())
    before = (tmp_path / "runs" / "spare.json.gz").read_bytes()
    store.save(tmp_path, store.load(tmp_path))
    assert (tmp_path / "runs" / "spare.json.gz").read_bytes() == before


def test_a_regime_no_longer_published_leaves_no_file_behind(tmp_path: Path) -> None:
    store.save(tmp_path, results())
    res = results()
    res["runs"] = [r for r in res["runs"] if r["regime"] == "spare"]
    res["excluded_runs"] = [r for r in res["excluded_runs"] if r["regime"] == "spare"]
    store.save(tmp_path, res)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["spare.json.gz"]
    assert store.load(tmp_path) == res


def test_two_labels_that_would_share_a_file_are_refused() -> None:
    res = {"runs": [run("2p1d, router a", 1), run("2p1d router a", 2)]}
    with pytest.raises(ValueError, match=r"would share 2p1d-router-a\.json\.gz"):
        store.split(res)
    with pytest.raises(ValueError, match="no letter or digit"):
        store.slug(", ")


def test_a_folder_or_file_from_before_the_split_still_loads(tmp_path: Path) -> None:
    (tmp_path / "production.json").write_text(json.dumps(results()))
    assert store.load(tmp_path) == results()
    assert store.load(tmp_path / "production.json") == results()
    store.save(tmp_path, results())  # saving in the new form retires the old file
    assert not (tmp_path / "production.json").exists()


def test_the_published_results_load_and_pool_to_what_the_index_says() -> None:
    res = store.load(RESULTS / "production")
    assert res["runs"] and {r["regime"] for r in res["runs"]} <= set(res["pooled"])
    before = json.loads(json.dumps(res["pooled"]))
    report.repool(res)
    assert res["pooled"] == before
