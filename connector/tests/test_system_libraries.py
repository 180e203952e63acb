"""The engine's system libraries: found where present, named with their package where not."""

from __future__ import annotations

import pytest

from boomerang.connector import engine_venv


def test_a_present_library_is_not_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_venv, "SYSTEM_LIBRARIES", {"libc.so.6": "libc6"})
    assert engine_venv.missing_libraries() == []
    engine_venv.ensure_system_libraries()  # nothing to do, nothing raised


def test_a_missing_library_without_apt_names_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_venv, "SYSTEM_LIBRARIES", {"libnot-there.so.7": "libnot-there7"})
    monkeypatch.setattr(engine_venv.os, "geteuid", lambda: 1000)  # not root: no apt-get
    assert engine_venv.missing_libraries() == ["libnot-there.so.7"]
    with pytest.raises(RuntimeError, match="install libnot-there7"):
        engine_venv.ensure_system_libraries()
