"""The validated resource: `DisaggregatedDeploymentSpec` (the spec's fields under the rules) and
`DisaggregatedDeployment` (metadata, spec, status as data).

Why a module of its own: it is the one place the types (spec.py) and the rules (rules.py) meet,
so every parse of a spec, by the operator or the local runtime, runs every rule.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from boomerang.operator.api.fields import FreeForm, Model
from boomerang.operator.api.rules import NAME_RULES, RULES
from boomerang.operator.api.spec import SpecFields


class DisaggregatedDeploymentSpec(SpecFields):
    """Desired state: the model, the engine, two roles, KV transfer, the router, placement."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> DisaggregatedDeploymentSpec:
        failed = [rule.message for rule in RULES if not rule.check(self)]
        if failed:
            raise ValueError("; ".join(failed))
        return self


class DisaggregatedDeployment(Model):
    """A disaggregated vLLM deployment with bidirectional KV reuse."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    api_version: Literal["boomerang.dev/v1alpha1"] = Field(
        "boomerang.dev/v1alpha1", description="API version."
    )
    kind: Literal["DisaggregatedDeployment"] = Field("DisaggregatedDeployment", description="Kind.")
    metadata: FreeForm = Field(default_factory=dict, description="Standard object metadata.")
    spec: DisaggregatedDeploymentSpec = Field(description="Desired state.")
    # Status is the operator's own output: it is read back as plain data, never re-validated,
    # so a status written by an older operator version can never block a reconcile.
    status: FreeForm | None = Field(None, description="Observed state.")

    @model_validator(mode="after")
    def _name_rules(self) -> DisaggregatedDeployment:
        failed = [rule.message for rule in NAME_RULES if not rule.check(self.name)]
        if failed:
            raise ValueError("; ".join(failed))
        return self

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "default")
