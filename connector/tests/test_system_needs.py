"""What the engine needs from the system: found where present, named by package where not."""

from __future__ import annotations

import pytest

from boomerang.connector.launch import engine_venv


def test_a_present_library_is_not_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_venv, "SYSTEM_NEEDS", {"libc.so.6": "libc6", "sh": "dash"})
    assert engine_venv.missing_system_needs() == []
    engine_venv.ensure_system_needs()  # nothing to do, nothing raised


def test_what_is_missing_without_apt_is_named_by_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        engine_venv, "SYSTEM_NEEDS", {"libnot-there.so.7": "libnot-there7", "Nothere.h": "x-dev"}
    )
    monkeypatch.setattr(engine_venv.os, "geteuid", lambda: 1000)  # not root: no apt-get
    assert engine_venv.missing_system_needs() == ["libnot-there.so.7", "Nothere.h"]
    with pytest.raises(RuntimeError, match="install libnot-there7 x-dev"):
        engine_venv.ensure_system_needs()
