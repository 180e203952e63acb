"""Generate the CustomResourceDefinition from the pydantic API (`make crds`).

The CRD is never edited by hand: `crds/` (for `kubectl apply`) and the Helm chart's template
(so `helm upgrade` carries schema changes, which Helm's own `crds/` folder would not) are both
written here from the `api` package. A unit test regenerates them in memory and fails, naming
`make crds`, when the committed files drift.

Pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema: every `$ref`
inlined, no `additionalProperties: false`, nullable optionals expressed as "not required",
object defaults of `{}` so nested defaults (and the CEL rules that read them) always apply
(except where the model says an object may be absent, `X | None`: absent means none there).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from boomerang.operator import api, scaler_api

CRD_NAME = f"{api.PLURAL}.{api.GROUP}"
CRD_FILE = f"{api.GROUP}_{api.PLURAL}.yaml"
CHART_TEMPLATE = "charts/boomerang/templates/crd.yaml"
SCALER_CRD_FILE = f"{api.GROUP}_{scaler_api.PLURAL}.yaml"
SCALER_CHART_TEMPLATE = "charts/boomerang/templates/crd-rolescaler.yaml"
COMMAND = "make crds"

PRINTER_COLUMNS = [
    {"name": "Prefill", "type": "integer", "jsonPath": ".status.prefill.ready",
     "description": "Ready prefill replicas"},
    {"name": "Decode", "type": "integer", "jsonPath": ".status.decode.ready",
     "description": "Ready decode replicas"},
    {"name": "Router", "type": "integer", "jsonPath": ".status.router.ready",
     "description": "Ready router replicas"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
     "description": "Ready condition"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]  # fmt: skip


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Rewrite one pydantic JSON-schema node into its structural OpenAPI form."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    any_of = node.get("anyOf")
    if any_of and any(alt.get("type") == "null" for alt in any_of):
        rest = [alt for alt in any_of if alt.get("type") != "null"]
        outer = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
        if len(rest) == 1:
            return _structural({**rest[0], **outer}, defs)
        node = {**outer, "anyOf": rest}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs") or (key == "additionalProperties" and value is False):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _structural(v, defs) for name, v in value.items()}
        else:
            out[key] = _structural(value, defs)
    if out.get("type") == "object" and "properties" in out:
        required = set(out.get("required", []))
        nullable = {n for n, v in node.get("properties", {}).items() if _nullable(v)}
        for name, prop in out["properties"].items():
            # `X | None`: absent means none (a chat template of the model's own), not `{}`.
            optional_object = (
                name not in required and name not in nullable and prop.get("type") == "object"
            )
            # A partial Kubernetes object (a pod template override) holds no defaults of ours.
            partial = prop.get("x-kubernetes-preserve-unknown-fields")
            ours = "properties" in prop and not prop.get("required") and not partial
            if optional_object and ours:
                prop.setdefault("default", {})
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def _nullable(node: Any) -> bool:
    """Whether a pydantic property may be null (`X | None`)."""
    alternatives = node.get("anyOf") if isinstance(node, dict) else None
    return isinstance(alternatives, list) and any(alt.get("type") == "null" for alt in alternatives)


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural schema of one pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return dict(_structural(raw, raw.get("$defs", {})))


def _validations(rules: Sequence[api.Rule[Any]]) -> list[dict[str, str]]:
    return [
        {
            "rule": r.cel,
            "message": r.message,
            "fieldPath": r.field_path,
            "reason": "FieldValueInvalid",
        }
        for r in rules
    ]


def crd() -> dict[str, Any]:
    """The DisaggregatedDeployment CustomResourceDefinition."""
    spec = openapi_schema(api.DisaggregatedDeploymentSpec)
    spec["x-kubernetes-validations"] = _validations(api.RULES)
    return _definition(
        kind=api.KIND,
        plural=api.PLURAL,
        singular=api.SINGULAR,
        short_names=api.SHORT_NAMES,
        doc=api.DisaggregatedDeployment.__doc__,
        spec=spec,
        status=openapi_schema(api.DisaggregatedDeploymentStatus),
        name_rules=_validations(api.NAME_RULES),
        subresources={"status": {}},
        columns=PRINTER_COLUMNS,
    )


def scaler_crd() -> dict[str, Any]:
    """The CRD of the per-role scaling adapter (scaler_api.py), with its scale subresource."""
    spec = openapi_schema(scaler_api.DisaggregatedRoleScalerSpec)
    spec["x-kubernetes-validations"] = _validations(scaler_api.SPEC_RULES)
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    return _definition(
        kind=scaler_api.KIND,
        plural=scaler_api.PLURAL,
        singular=scaler_api.SINGULAR,
        short_names=scaler_api.SHORT_NAMES,
        doc=scaler_api.DisaggregatedRoleScaler.__doc__,
        spec=spec,
        status=openapi_schema(scaler_api.DisaggregatedRoleScalerStatus),
        name_rules=_validations(scaler_api.NAME_RULES),
        subresources={"status": {}, "scale": scale},
        columns=scaler_api.PRINTER_COLUMNS,
    )


def _definition(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: list[str],
    doc: str | None,
    spec: dict[str, Any],
    status: dict[str, Any],
    name_rules: list[dict[str, Any]],
    subresources: dict[str, Any],
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    """One namespaced CRD of the group, served and stored at the API's one version."""
    schema = {
        "type": "object",
        "description": doc,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version."},
            "kind": {"type": "string", "description": "Kind."},
            # Naming `name` lets the root's rules on it point their fieldPath at it.
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": spec,
            "status": status,
        },
        # Only rules at the root can read metadata.name (of metadata, only it and generateName).
        "x-kubernetes-validations": name_rules,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{api.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "boomerang"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short_names,
                "categories": ["boomerang"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


_HEADER = "# Generated by `make crds` from operator/src/boomerang/operator/api/. Do not edit.\n"
_SCALER_HEADER = _HEADER.replace("api/", "scaler_api.py")


def rendered(root: Path | None = None) -> dict[str, str]:
    """Relative path -> file content of every generated file (the field reference only when
    `root` is given)."""
    body = yaml.safe_dump(crd(), sort_keys=False, width=100)
    scaler = yaml.safe_dump(scaler_crd(), sort_keys=False, width=100)
    files = {
        f"crds/{CRD_FILE}": _HEADER + body,
        CHART_TEMPLATE: _chart_template(_HEADER, body),
        f"crds/{SCALER_CRD_FILE}": _SCALER_HEADER + scaler,
        SCALER_CHART_TEMPLATE: _chart_template(_SCALER_HEADER, scaler),
    }
    reference = _reference(root) if root is not None else None
    if reference is not None:
        files[REFERENCE_DOC] = reference
    return files


def _chart_template(header: str, body: str) -> str:
    """The chart's copy of a CRD: installed unless crds.install is false, kept on uninstall."""
    return (
        header
        + "{{- if .Values.crds.install }}\n"
        + body.replace(
            "  labels:\n", "  annotations:\n    helm.sh/resource-policy: keep\n  labels:\n", 1
        )
        + "{{- end }}\n"
    )


REFERENCE_DOC = "docs/api-reference.md"
"""Where the field reference lives, between its markers (the README links to it)."""
REFERENCE_START = "<!-- api-reference:start (generated by `make crds`) -->"
REFERENCE_END = "<!-- api-reference:end -->"


def _type_name(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity"
    if "enum" in node:
        return " \\| ".join(str(v) for v in node["enum"])
    if node.get("type") == "array":
        return f"[]{_type_name(node.get('items', {}))}"
    if node.get("type") == "object" and "additionalProperties" in node:
        return f"map[string]{_type_name(node['additionalProperties'])}"
    return str(node.get("type", "object"))


def _rows(node: dict[str, Any], path: str) -> list[str]:
    rows = []
    for name, prop in node.get("properties", {}).items():
        here = f"{path}.{name}"
        default = prop.get("default")
        shown = "" if default in (None, {}) else f"`{json.dumps(default)}`"
        text = " ".join(str(prop.get("description", "")).split())
        rows.append(f"| `{here}` | {_type_name(prop)} | {shown} | {text} |")
        if prop.get("type") == "object" and "properties" in prop:
            rows += _rows(prop, here)
    return rows


def reference_markdown() -> str:
    """The field reference table of `spec` (`REFERENCE_DOC`)."""
    spec = openapi_schema(api.DisaggregatedDeploymentSpec)
    lines = ["| field | type | default | description |", "|---|---|---|---|"]
    lines += _rows(spec, "spec")
    lines.append("")
    lines.append("Rules enforced at admission (CEL) and by the operator:")
    lines.append("")
    lines += [f"- {rule.message}" for rule in api.NAME_RULES]
    lines += [f"- {rule.message}" for rule in api.RULES]
    return "\n".join(lines)


def _reference(root: Path) -> str | None:
    path = root / REFERENCE_DOC
    if not path.exists():
        return None
    text = path.read_text()
    if REFERENCE_START not in text:
        return None
    head, rest = text.split(REFERENCE_START, 1)
    tail = rest.split(REFERENCE_END, 1)[1]
    return f"{head}{REFERENCE_START}\n{reference_markdown()}\n{REFERENCE_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    root = Path(argv[0] if argv else ".").resolve()
    for rel, content in rendered(root).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
