"""The `DisaggregatedRoleScaler` API: one role's replica count, behind a scale subresource.

A scale subresource holds one replica count per object, and a `DisaggregatedDeployment` has
two roles, so each role that opts in (`spec.<role>.replicasFrom: Scaler`) gets a small object
of its own, named `<deployment>-<role>`, that `kubectl scale`, a HorizontalPodAutoscaler or KEDA
can target. Its `spec.replicas` is then the only owner of that role's replica count: the
operator creates the scaler once (seeded from `spec.<role>.replicas`), never writes its spec
again, and renders the StatefulSet's replicas from it. Its status (the role's pods and their
label selector, which an HPA needs) is written by the operator.

Like `api/`, these models are the single source of the CRD (`crdgen.py`), its CEL rules and
its printer columns.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from boomerang.operator import cel
from boomerang.operator.api import INT32_MAX, MAX_NAME_LENGTH, Model, Rule

KIND = "DisaggregatedRoleScaler"
PLURAL = "disaggregatedrolescalers"
SINGULAR = "disaggregatedrolescaler"
SHORT_NAMES = ["drs", "rolescaler"]


class DisaggregatedRoleScalerSpec(Model):
    """Which role this scales, and how many pods it should have."""

    deployment_name: str = Field(
        description="The DisaggregatedDeployment (same namespace) whose role this scales.",
        min_length=1,
        max_length=MAX_NAME_LENGTH,
    )
    role: Literal["prefill", "decode"] = Field(description="The role scaled: prefill or decode.")
    replicas: int = Field(
        description="Engine pods this role should have: what `kubectl scale`, an HPA or KEDA "
        "write through the scale subresource.",
        ge=1,
        le=INT32_MAX,
    )


class DisaggregatedRoleScalerStatus(Model):
    """The role's pods, as its StatefulSet reports them (written by the operator)."""

    replicas: int = Field(0, description="Pods the role's StatefulSet has.")
    ready_replicas: int = Field(0, description="Of those, pods ready to serve.")
    selector: str = Field(
        "", description="Label selector of the role's pods (the scale subresource's selector)."
    )
    observed_generation: int = Field(0, description="The scaler generation the role runs at.")


class DisaggregatedRoleScaler(Model):
    """A per-role scaling adapter: a scale subresource for one role of a deployment."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    api_version: Literal["boomerang.dev/v1alpha1"] = Field(
        "boomerang.dev/v1alpha1", description="API version."
    )
    kind: Literal["DisaggregatedRoleScaler"] = Field("DisaggregatedRoleScaler", description="Kind.")
    metadata: dict[str, object] = Field(default_factory=dict, description="Object metadata.")
    spec: DisaggregatedRoleScalerSpec = Field(description="Desired state.")


SPEC_RULES: tuple[Rule[DisaggregatedRoleScalerSpec], ...] = (
    Rule(
        cel="self.deploymentName == oldSelf.deploymentName",
        message="spec.deploymentName is immutable",
        field_path=".deploymentName",
        check=lambda s: True,  # a transition rule: only the API server sees the old object
    ),
    Rule(
        cel="self.role == oldSelf.role",
        message="spec.role is immutable",
        field_path=".role",
        check=lambda s: True,
    ),
)

NAME_RULES: tuple[Rule[DisaggregatedRoleScaler], ...] = (
    Rule(
        cel=f"!({cel.present('metadata.name')} && {cel.present('spec.deploymentName')} && "
        f"has(self.spec.role)) || "
        "self.metadata.name == self.spec.deploymentName + '-' + self.spec.role",
        message="metadata.name must be <spec.deploymentName>-<spec.role> (the role's "
        "StatefulSet name)",
        field_path=".metadata.name",
        check=lambda s: s.metadata.get("name") == f"{s.spec.deployment_name}-{s.spec.role}",
    ),
)
"""Rules at the schema's root, where metadata.name can be read."""

PRINTER_COLUMNS = [
    {"name": "Deployment", "type": "string", "jsonPath": ".spec.deploymentName"},
    {"name": "Role", "type": "string", "jsonPath": ".spec.role"},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas",
     "description": "Replicas asked for"},
    {"name": "Current", "type": "integer", "jsonPath": ".status.replicas",
     "description": "Pods the role's StatefulSet has"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas",
     "description": "Pods ready"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]  # fmt: skip
