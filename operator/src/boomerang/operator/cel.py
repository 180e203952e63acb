"""CEL for the CRD's validation rules that evaluates on any object, whatever fields it lacks.

A CEL rule that reads a field the object does not have fails to evaluate: the API server then
refuses the resource with `no such key: annotations evaluating rule: ...` instead of the rule's
own message, and a valid resource can be refused too. The API server fills the schema's
defaults in before it validates, but not every optional field has a default (a map such as
`router.service.annotations` has none) and a rule must not depend on which ones do.

So the rules in `api/rules.py` read fields only through these helpers: `present` guards every object
on the path with `has()`, and `value` reads a field or, when it or an object above it is
absent, the API model's own default for it (one source of truth for defaults: the pydantic
field). Pure string building; `e2e/test_admission.py` runs every rule on the real API server
against a copy of the CRD with every schema default removed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def present(path: str) -> str:
    """`has()` on every step of `path` (relative to `self`): true when the field is set."""
    parts = path.split(".")
    return " && ".join(f"has(self.{'.'.join(parts[: i + 1])})" for i in range(len(parts)))


def value(model: type[BaseModel], path: str) -> str:
    """The field at `path`, or the model's default for it where it or an object above it is
    absent."""
    return f"({present(path)} ? self.{path} : {literal(default(model, path))})"


def default(model: type[BaseModel], path: str) -> Any:
    """The API model's default of the field at `path` (camelCase names, as on the wire)."""
    current: Any = model
    field = None
    for name in path.split("."):
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            raise ValueError(f"{path}: {name!r} is not inside an object of the API")
        fields = {f.alias or key: f for key, f in current.model_fields.items()}
        if name not in fields:
            raise ValueError(f"{path}: no field {name!r} in {current.__name__}")
        field = fields[name]
        current = field.annotation
    assert field is not None
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    raise ValueError(f"{path} has no default: guard it with present()")


def literal(data: Any) -> str:
    """A CEL literal of a default: a bool, an int, a string or an empty map."""
    if isinstance(data, bool):
        return "true" if data else "false"
    if isinstance(data, int):
        return str(data)
    if isinstance(data, str) and "'" not in data and "\\" not in data:
        return f"'{data}'"
    if data == {}:
        return "{}"
    raise ValueError(f"no CEL literal for the default {data!r}")
