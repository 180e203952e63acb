"""Shared test helpers: the samples, the invalid cases, parsing."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from boomerang.operator.api import DisaggregatedDeployment
from boomerang.operator.merge import deep_merge

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = yaml.safe_load((Path(__file__).parent / "invalid-specs.yaml").read_text())


def manifest(name: str = "minimal") -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    return data


def deployment(
    name: str = "minimal", patch: dict[str, Any] | None = None, **metadata: Any
) -> DisaggregatedDeployment:
    data = manifest(name)
    data["spec"] = deep_merge(data["spec"], patch or {})
    data["metadata"] = {"namespace": "default", **data["metadata"], **metadata}
    return DisaggregatedDeployment.model_validate(copy.deepcopy(data))
