"""The committed CRDs are generated from the API model, and are structural."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from dd_testing import ROOT

from boomerang.operator import api, crdgen, scaler_api


@pytest.mark.parametrize("rel", sorted(crdgen.rendered(ROOT)))
def test_committed_crd_and_reference_match_the_api_model(rel: str) -> None:
    path = ROOT / rel
    expected = crdgen.rendered(ROOT)[rel]
    actual = path.read_text() if path.exists() else ""
    assert actual == expected, f"{rel} is out of date: run `{crdgen.COMMAND}` and commit"


def _schemas(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.get("properties", {}).items():
            yield from _schemas(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from _schemas(node["items"], f"{path}[]")


def _root() -> dict[str, Any]:
    schema: dict[str, Any] = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_schema_is_structural() -> None:
    for path, node in _schemas(_root()):
        assert "$ref" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path


def test_every_spec_and_status_field_has_a_description() -> None:
    for path, node in _schemas(_root()):
        if path.startswith((".spec", ".status")) and not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description"


def test_crd_has_status_subresource_printer_columns_and_short_names() -> None:
    spec = crdgen.crd()["spec"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Prefill", "Decode", "Router", "Ready", "Age"]
    assert "dd" in spec["names"]["shortNames"]


def test_cel_rules_name_their_field() -> None:
    rules = _root()["properties"]["spec"]["x-kubernetes-validations"]
    assert len(rules) >= 5
    for rule in rules:
        assert rule["message"].startswith("spec."), rule
        assert rule["fieldPath"].startswith("."), rule


_SELF_PATH = re.compile(r"(has\()?\bself((?:\.[A-Za-z_][A-Za-z0-9_]*)+)(\()?")


def _unguarded_reads(expression: str) -> list[str]:
    """Every field path the expression reads without `has()` on it and each object above it
    (method calls such as `.matches(...)` are not fields)."""
    missing = []
    for m in _SELF_PATH.finditer(expression):
        if m.group(1):  # inside has() itself
            continue
        parts = m.group(2).lstrip(".").split(".")
        if m.group(3):  # a method call: the last name is the method
            parts = parts[:-1]
        for i in range(len(parts)):
            path = ".".join(parts[: i + 1])
            if f"has(self.{path})" not in expression:
                missing.append(path)
    return missing


@pytest.mark.parametrize(
    "rule",
    [*api.RULES, *api.NAME_RULES, *scaler_api.NAME_RULES],
    ids=lambda r: r.message[:60],
)
def test_cel_rules_check_with_has_every_field_they_read(rule) -> None:
    # Necessary, not sufficient: e2e/test_admission.py runs every rule on the real API server
    # against a CRD without defaults.
    assert _unguarded_reads(rule.cel) == [], rule.cel


def test_the_has_check_itself_finds_an_unguarded_read() -> None:
    unsafe = "self.router.service.type != 'LoadBalancer' || 'k' in self.router.service.annotations"
    assert "router.service.annotations" in _unguarded_reads(unsafe)
    assert _unguarded_reads("!has(self.a) || self.a.matches('x')") == []
