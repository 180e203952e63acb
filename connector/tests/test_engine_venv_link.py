"""The engine venv links the installed Boomerang, not a checkout's build metadata."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from boomerang.connector.launch import engine_venv


def test_a_checkouts_egg_info_on_sys_path_is_not_taken_for_the_installation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "boomerang.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: boomerang\nVersion: 0.0.0\n")
    (stale / "SOURCES.txt").write_text("pyproject.toml\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` from a checkout does
    dist = engine_venv._installed()
    assert dist.version != "0.0.0"
    root, files, _ = engine_venv._own_files()
    assert Path(sys.prefix) in root.parents
    assert not any(str(f) == "pyproject.toml" for f in files)
    assert any(f.name.endswith(".pth") or "boomerang" in f.parts for f in files)
