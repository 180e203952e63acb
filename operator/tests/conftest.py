"""Fixtures shared by the operator's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cluster import bin_dir


@pytest.fixture(scope="module")
def helm() -> Path:
    """The helm binary; skipped without it, a failure under CI."""
    path = bin_dir() / "helm"
    if not os.access(path, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"helm is missing at {path}: run `make tools`")
        pytest.skip("helm not built: run `make tools`")
    return path
