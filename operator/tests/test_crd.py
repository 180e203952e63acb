"""The committed CRDs are generated from the API model, and are structural."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dd_testing import ROOT

from boomerang.operator import crdgen


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
