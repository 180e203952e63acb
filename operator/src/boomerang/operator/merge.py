"""Deep merge for the pod-template escape hatch and user affinity.

Users patch generated pod templates the way they patch Kubernetes objects: mappings merge
recursively, lists of named items (containers, volumes, env, ports) merge by `name`, and any
other list or scalar in the overlay replaces the base. Pure; inputs are never mutated.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `overlay` merged over it."""
    out = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        current = out.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(current, value)
        elif isinstance(current, list) and _named_list(current) and _named_list(value):
            out[key] = _merge_named(current, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, Mapping) and "name" in item for item in value
    )


def _merge_named(base: list[Any], overlay: list[Any]) -> list[Any]:
    merged = [copy.deepcopy(item) for item in base]
    index = {item["name"]: i for i, item in enumerate(merged)}
    for item in overlay:
        if item["name"] in index:
            i = index[item["name"]]
            merged[i] = deep_merge(merged[i], item)
        else:
            merged.append(copy.deepcopy(item))
    return merged
