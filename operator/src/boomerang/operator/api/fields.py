"""Field types shared by the spec's parts: Kubernetes quantities, free-form objects, pod template
overrides, and the base model every API type derives from.

Why a module of its own: these say how a value looks on the wire (`x-kubernetes-int-or-string`,
`x-kubernetes-preserve-unknown-fields`, the typed parts of a partial pod template that the
builders' deep merge relies on), which is a schema concern apart from what any field means.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

_QUANTITY_RE = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


Quantity = Annotated[
    str,
    BeforeValidator(lambda v: str(v) if isinstance(v, int | float) else v),
    Field(pattern=_QUANTITY_RE),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": _QUANTITY_RE,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
FreeFormList = Annotated[
    list[dict[str, Any]],
    WithJsonSchema(
        {
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        }
    ),
]


def _open_object(description: str | None, **properties: dict[str, Any]) -> dict[str, Any]:
    """A part of a Kubernetes object: the fields named here are typed, any other is kept."""
    node: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if description:
        node["description"] = description
    return {**node, "properties": properties}


def _by_name(description: str, **properties: dict[str, Any]) -> dict[str, Any]:
    name = {"type": "string", "description": "Merge key: replaces the generated item of this name."}
    item = _open_object(None, name=name, **properties)
    return {"type": "array", "description": description, "items": item}


def _strings(description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "additionalProperties": {"type": "string"},
    }


_POD_TEMPLATE_SCHEMA = _open_object(
    None,
    metadata=_open_object(
        "Pod metadata.",
        labels=_strings("Extra pod labels."),
        annotations=_strings("Extra pod annotations."),
    ),
    spec=_open_object(
        "Pod spec fields.",
        containers=_by_name(
            "Containers, merged by name with the generated ones.",
            env=_by_name("Env, merged by name."),
            ports=_by_name("Ports, merged by name."),
            volumeMounts=_by_name("Volume mounts, merged by name."),
        ),
        volumes=_by_name("Volumes, merged by name with the generated ones."),
    ),
)
"""What the builders' deep merge (merge.py) reads in a pod template override: the mappings it
writes into and the names it merges lists by. Everything else passes through untyped."""


def _conform(value: Any, schema: dict[str, Any], path: str) -> None:
    """Raise unless `value` has the types `schema` names, as the API server checks them."""
    kind = schema["type"]
    if not isinstance(value, {"object": dict, "array": list, "string": str}[kind]):
        raise ValueError(f"{path} must be of type {kind}")
    if kind == "array":
        for i, item in enumerate(value):
            _conform(item, schema["items"], f"{path}[{i}]")
    elif kind == "object":
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            if sub is not None:
                _conform(item, sub, f"{path}.{key}")


def _check_pod_template(value: dict[str, Any]) -> dict[str, Any]:
    _conform(value, _POD_TEMPLATE_SCHEMA, "podTemplate")
    return value


PodTemplate = Annotated[
    dict[str, Any],
    AfterValidator(_check_pod_template),
    WithJsonSchema(_POD_TEMPLATE_SCHEMA),
]


class Model(BaseModel):
    """Every API type: camelCase on the wire, snake_case in Python, unknown fields refused,
    immutable once parsed."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )
