"""Shared test helpers: the samples, the invalid cases, parsing."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from boomerang.operator.api import NAME_RULES, RULES, DisaggregatedDeployment, Rule
from boomerang.operator.merge import deep_merge

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "invalid-specs.yaml").read_text()
)


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


def merge_patch(target: Any, patch: Any) -> Any:
    """`target` with a JSON merge patch (RFC 7386) applied: mappings merge, null removes."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def invalid_manifest(case: dict[str, Any]) -> dict[str, Any]:
    """examples/minimal.yaml broken as one case of invalid-specs.yaml says."""
    data = manifest("minimal")
    data["spec"] = merge_patch(data["spec"], case.get("patch", {}))
    data["metadata"] = merge_patch(data["metadata"], case.get("metadata", {}))
    return data


def rule_for(case: dict[str, Any]) -> Rule[Any] | None:
    """The CEL rule an invalid case breaks (its field and a part of its message), or None for a
    case the OpenAPI schema refuses. Raises when the case's message fits several rules."""
    if "message" not in case:
        return None
    path = "." + case["field"].removeprefix("spec.")
    found = [
        rule
        for rule in (*RULES, *NAME_RULES)
        if rule.field_path == path and case["message"] in rule.message
    ]
    assert len(found) <= 1, f"{case['name']}: its message fits {len(found)} rules"
    return found[0] if found else None
