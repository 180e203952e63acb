"""The `DisaggregatedDeployment` API: the single source of truth for the custom resource.

Everything else is derived from these pydantic models: the CRD's OpenAPI schema, its CEL rules
and printer columns (`crdgen.py`), the operator's parsing of live objects, the local runtime's
parsing of manifests. Field names are camelCase on the wire (Kubernetes convention) and
snake_case in Python. Every field carries a `description`, which becomes `kubectl explain`.

This package is the public surface (`from boomerang.operator.api import ...`); its modules keep
apart what kubebuilder keeps apart, so each can be read and changed on its own:
- `names`: group, version, kind, images, and the longest name whose children fit;
- `durations`: Go-style durations, parsed as CEL's `duration()` reads them;
- `fields`: wire types (quantities, free-form objects, pod template overrides), the base model;
- `serving`, `kvtransfer`, `router`: the spec's parts; `spec`: the spec's fields assembled;
- `rules`: the cross-field rules, each CEL for admission and the same check in Python;
- `resource`: the validated spec and resource (types and rules meet there);
- `status`: what the operator writes in status.
"""

from __future__ import annotations

from boomerang.operator.api.durations import (
    DURATION_RE,
    MAX_DURATION_NS,
    NS_PER_S,
    Duration,
    duration_ns,
    parse_duration,
)
from boomerang.operator.api.fields import (
    FreeForm,
    FreeFormList,
    Model,
    PodTemplate,
    Quantity,
)
from boomerang.operator.api.kvtransfer import (
    BreakEvenBounds,
    ContinueOnDecodeSpec,
    KVTransferSpec,
    RetentionSpec,
    TuningSpec,
)
from boomerang.operator.api.names import (
    API_VERSION,
    CHILD_SUFFIXES,
    DEFAULT_ENGINE_IMAGE,
    DEFAULT_ROUTER_IMAGE,
    DNS_LABEL_MAX,
    DNS_SUBDOMAIN_MAX,
    GROUP,
    IMAGE_REGISTRY,
    IMAGE_TAG,
    INT32_MAX,
    KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    STATEFULSET_SUFFIX_MAX,
    VERSION,
)
from boomerang.operator.api.resource import DisaggregatedDeployment, DisaggregatedDeploymentSpec
from boomerang.operator.api.router import (
    ContainerResources,
    RouterServiceSpec,
    RouterSpec,
    SecretKeyRef,
    StoreSpec,
)
from boomerang.operator.api.rules import INTERNAL_LB_ANNOTATIONS, NAME_RULES, RULES, Rule
from boomerang.operator.api.serving import (
    MAX_MODEL_SOURCE_LENGTH,
    ChatTemplateRef,
    ConfigMapKeyRef,
    EfaSpec,
    EngineSpec,
    EnvVar,
    ModelCache,
    ModelSpec,
    PlacementSpec,
    RoleResources,
    RoleSpec,
)
from boomerang.operator.api.spec import SpecFields
from boomerang.operator.api.status import (
    Condition,
    DisaggregatedDeploymentStatus,
    EffectiveKVTransfer,
    PathShares,
    RoleStatus,
    RouterStatus,
)

__all__ = [
    "API_VERSION",
    "CHILD_SUFFIXES",
    "DEFAULT_ENGINE_IMAGE",
    "DEFAULT_ROUTER_IMAGE",
    "DNS_LABEL_MAX",
    "DNS_SUBDOMAIN_MAX",
    "DURATION_RE",
    "GROUP",
    "IMAGE_REGISTRY",
    "IMAGE_TAG",
    "INT32_MAX",
    "INTERNAL_LB_ANNOTATIONS",
    "KIND",
    "MAX_DURATION_NS",
    "MAX_MODEL_SOURCE_LENGTH",
    "MAX_NAME_LENGTH",
    "NAME_RULES",
    "NS_PER_S",
    "PLURAL",
    "RULES",
    "SHORT_NAMES",
    "SINGULAR",
    "STATEFULSET_SUFFIX_MAX",
    "VERSION",
    "BreakEvenBounds",
    "ChatTemplateRef",
    "Condition",
    "ConfigMapKeyRef",
    "ContainerResources",
    "ContinueOnDecodeSpec",
    "DisaggregatedDeployment",
    "DisaggregatedDeploymentSpec",
    "DisaggregatedDeploymentStatus",
    "Duration",
    "EfaSpec",
    "EffectiveKVTransfer",
    "EngineSpec",
    "EnvVar",
    "FreeForm",
    "FreeFormList",
    "KVTransferSpec",
    "Model",
    "ModelCache",
    "ModelSpec",
    "PathShares",
    "PlacementSpec",
    "PodTemplate",
    "Quantity",
    "RetentionSpec",
    "RoleResources",
    "RoleSpec",
    "RoleStatus",
    "RouterServiceSpec",
    "RouterSpec",
    "RouterStatus",
    "Rule",
    "SecretKeyRef",
    "SpecFields",
    "StoreSpec",
    "TuningSpec",
    "duration_ns",
    "parse_duration",
]
