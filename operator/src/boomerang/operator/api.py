"""The `DisaggregatedDeployment` API: the single source of truth for the custom resource.

Everything else is derived from these pydantic models: the CRD's OpenAPI schema, its CEL rules
and printer columns (`crdgen.py`), the operator's parsing of live objects, the local runtime's
parsing of manifests. Field names are camelCase on the wire (Kubernetes convention) and
snake_case in Python. Every field carries a `description`, which becomes `kubectl explain`.

Cross-field rules are declared once in `RULES`: each has the CEL expression the API server
enforces at admission and the same check in Python, so the operator and the local runtime reject
what the API server would, with the same message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from boomerang.connector.config import (
    MODEL_SOURCE_RE,
    MODEL_SOURCE_SHAPES,
    ROLES,
    Role,
    default_handle_ttl,
    model_source_error,
)
from boomerang.operator import cel

GROUP = "boomerang.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DisaggregatedDeployment"
PLURAL = "disaggregateddeployments"
SINGULAR = "disaggregateddeployment"
SHORT_NAMES = ["dd", "disagg"]

IMAGE_REGISTRY = "ghcr.io/boomerang-dev"
"""Where the release workflow publishes the images (the chart's `image.registry` names it too)."""
IMAGE_TAG = "0.1.0"
"""The images of this release: the project's version and the chart's appVersion (tested)."""
DEFAULT_ENGINE_IMAGE = f"{IMAGE_REGISTRY}/connector:{IMAGE_TAG}"
DEFAULT_ROUTER_IMAGE = f"{IMAGE_REGISTRY}/router:{IMAGE_TAG}"

DNS_LABEL_MAX = 63
"""Kubernetes' limit on a DNS label: Service and StatefulSet names, pod hostnames, label values."""
DNS_SUBDOMAIN_MAX = 253
"""Kubernetes' limit on the other names (ConfigMaps, Deployments, RBAC, policies)."""
INT32_MAX = 2**31 - 1
"""StatefulSets' and Deployments' replica counts are int32s."""
STATEFULSET_SUFFIX_MAX = len(f"-{INT32_MAX - 1}")
"""The most Kubernetes appends to a StatefulSet's name, 11 characters: its pods are named
`<statefulset>-<ordinal>` (ordinals below replicas <= INT32_MAX have 10 digits at most), and are
labelled `controller-revision-hash: <statefulset>-<hash>` (a 32-bit hash, encoded in at most 10
characters). Both must stay DNS labels: a pod's name is its hostname and a label value."""
_STATEFULSET_SUFFIXES = tuple(f"-{role}" for role in ROLES)
_SERVICE_SUFFIXES = (*_STATEFULSET_SUFFIXES, "-router")
CHILD_SUFFIXES = (*_SERVICE_SUFFIXES, "-engines", "-lease-token")
"""What the operator appends to the resource's name for its children (`render.child_name`): the
roles' StatefulSets and headless Services, the router's objects, the engines' NetworkPolicy,
the lease token's Secret."""
MAX_NAME_LENGTH = min(
    DNS_LABEL_MAX,  # the name itself is a label value (app.kubernetes.io/instance)
    DNS_LABEL_MAX - max(map(len, _SERVICE_SUFFIXES)),  # Services: 63 - 8 = 55
    DNS_LABEL_MAX - max(map(len, _STATEFULSET_SUFFIXES)) - STATEFULSET_SUFFIX_MAX,  # 63-8-11
    DNS_SUBDOMAIN_MAX - max(map(len, CHILD_SUFFIXES)),  # everything else: 253 - 8 = 245
)
"""The longest `metadata.name` whose children all fit: 44, set by the prefill StatefulSet's pods
and revision labels (63 - len("-prefill") - 11). Longer names are refused at admission
(`NAME_RULES`): the API server would otherwise admit them, and then refuse some children only."""

MAX_MODEL_SOURCE_LENGTH = 2048
"""An S3 key alone may be 1,024 bytes; a bound lets the API server cost the CEL rule."""
_DURATION_RE = r"^([0-9]{1,5}([.][0-9]+)?(ms|s|m|h)){1,4}$"
"""A duration: Go's syntax (`480s`, `8m`, `1h30m`, `0.5s`), at most four parts of at most five
digits before the point. So at most 400,000 hours, far below Go's limit (about 2.56 million):
every duration the schema admits converts in CEL's `duration()`, and no rule fails to
evaluate on one (past the limit the conversion fails). No backslash, so that a CEL string
literal carries it unchanged."""
_DURATION_PART = re.compile(r"([0-9]+)(?:\.([0-9]+))?(ms|s|m|h)")
NS_PER_S = 10**9
_UNIT_NS = {"ms": 10**6, "s": NS_PER_S, "m": 60 * NS_PER_S, "h": 3600 * NS_PER_S}
MAX_DURATION_NS = 2**63 - 1
"""Go's (and so CEL's) longest duration, about 292 years: longer ones fail to parse there
(`_DURATION_RE` admits none)."""
_QUANTITY_RE = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def duration_ns(value: str) -> int:
    """Nanoseconds in a Go-style duration (`480s`, `8m`, `1h30m`), as CEL's `duration()` reads it.

    Computed the way Go's `time.ParseDuration` (which CEL calls) does, down to its float rounding
    of fractions, so that a rule comparing durations gives the same answer here and in the API
    server, even at its bounds. The pattern keeps every duration far below Go's longest.
    """
    if not re.fullmatch(_DURATION_RE, value):
        raise ValueError(
            f"invalid duration {value!r}: up to four numbers of at most five digits, each with "
            f"ms, s, m or h, e.g. 480s or 1h30m"
        )
    total = 0
    for whole, fraction, unit in _DURATION_PART.findall(value):
        total += int(whole) * _UNIT_NS[unit] + _fraction_ns(fraction, _UNIT_NS[unit])
    return total


def _fraction_ns(digits: str, unit_ns: int) -> int:
    """Go's `leadingFraction`: the digits that fit an int64 count, then one float64 product."""
    numerator, scale = 0, 1.0
    for digit in digits:
        if numerator > MAX_DURATION_NS // 10 or numerator * 10 + int(digit) > 2**63:
            break
        numerator, scale = numerator * 10 + int(digit), scale * 10
    return int(float(numerator) * (float(unit_ns) / scale)) if numerator else 0


def parse_duration(value: str) -> float:
    """Seconds in a Go-style duration (see `duration_ns`)."""
    return duration_ns(value) / NS_PER_S


def _check_duration(value: Any) -> Any:
    if isinstance(value, str):
        parse_duration(value)
    return value


Duration = Annotated[
    str,
    BeforeValidator(_check_duration),
    WithJsonSchema({"type": "string", "pattern": _DURATION_RE}),
]
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


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class EnvVar(_Model):
    """One environment variable, as in a Kubernetes container."""

    name: str = Field(description="Variable name.", min_length=1)
    value: str | None = Field(None, description="Literal value.")
    value_from: FreeForm | None = Field(
        None, description="A Kubernetes EnvVarSource (secretKeyRef, fieldRef, ...)."
    )


class SecretKeyRef(_Model):
    """A key inside a Secret in the resource's namespace."""

    name: str = Field(description="Secret name.", min_length=1)
    key: str = Field(description="Key inside the Secret.", min_length=1)


class ModelCache(_Model):
    """Where engines keep downloaded weights (HF_HOME) and built models between restarts."""

    size: Quantity | None = Field(
        None,
        description="Cache size: the node-local volume's sizeLimit and its ephemeral-storage "
        "request, or each pod's PersistentVolumeClaim when persistent.",
    )
    persistent: bool = Field(
        False,
        description="One PersistentVolumeClaim per pod (StatefulSet volumeClaimTemplates): "
        "weights survive pod deletion and rescheduling, not only container restarts. "
        "Kubernetes does not let a StatefulSet change this after creation.",
    )
    storage_class_name: str | None = Field(
        None, description="StorageClass of the persistent cache; the cluster's default if unset."
    )


class ConfigMapKeyRef(_Model):
    """A key inside a ConfigMap in the resource's namespace."""

    name: str = Field(description="ConfigMap name.", min_length=1, max_length=DNS_SUBDOMAIN_MAX)
    key: str = Field(
        description="Key inside the ConfigMap (the template file's name in the pod).",
        pattern=r"^[-._a-zA-Z0-9]+$",
        max_length=253,
    )


class ChatTemplateRef(_Model):
    """Where the chat template both roles render prompts with comes from (exactly one)."""

    config_map_key_ref: ConfigMapKeyRef | None = Field(
        None,
        description="A ConfigMap key holding the template, mounted into every engine pod. Read "
        "when an engine starts: to change the template, name another key or ConfigMap (which "
        "rolls both roles together).",
    )
    file: str | None = Field(
        None,
        description="A file in the model, relative to its root (e.g. a repository's "
        "tool-use template): read from the model folder (builtin://, pvc://) or fetched from "
        "the Hugging Face repository (hf://); not for s3:// models.",
        min_length=1,
        max_length=1024,
    )


_PARSER_NAME = r"^[A-Za-z0-9][-_.A-Za-z0-9]*$"


class ModelSpec(_Model):
    """What the engines serve."""

    source: str = Field(
        description=(
            f"Model location, one of {MODEL_SOURCE_SHAPES}: a Hugging Face id, an S3 prefix "
            "(streamed), a path in a PersistentVolumeClaim (mounted at /models), or a "
            "deterministic test model built on first start. Anything else is refused."
        ),
        min_length=1,
        max_length=MAX_MODEL_SOURCE_LENGTH,
    )
    served_name: str = Field(
        description="Model name clients send in requests.", min_length=1, max_length=253
    )
    max_model_len: int | None = Field(
        None, description="Context length in tokens; the model's own when unset.", ge=1
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weight and activation dtype."
    )
    cache: ModelCache = Field(
        default_factory=lambda: ModelCache(),
        description="The engines' model cache (downloads land there, not in the container).",
    )
    tool_call_parser: str | None = Field(
        None,
        description="vLLM's tool-call parser for the model (e.g. hermes for Qwen3): requests "
        "with `tools` are served, and tool calls come back as structured calls. Both roles "
        "get it.",
        pattern=_PARSER_NAME,
        max_length=128,
    )
    reasoning_parser: str | None = Field(
        None,
        description="vLLM's reasoning parser for the model (e.g. qwen3): reasoning comes back "
        "apart from the answer. Both roles get it.",
        pattern=_PARSER_NAME,
        max_length=128,
    )
    chat_template: ChatTemplateRef | None = Field(
        None,
        description="The chat template both roles render prompts with; the model's own when "
        "unset. P and D must render a prompt identically, so it is one setting for both.",
    )


class EngineSpec(_Model):
    """The engine both roles run: P and D must run the same vLLM build to handshake."""

    image: str = Field(
        DEFAULT_ENGINE_IMAGE,
        description="Connector image: vLLM, NIXL with UCX and LIBFABRIC, EFA libraries.",
        min_length=1,
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of the engine image."
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Extra vLLM arguments for both roles."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra env for both roles.")


class RoleResources(_Model):
    """Compute one engine pod gets; EFA and hugepages are first-class, not hidden in overrides."""

    cpu: Quantity | None = Field(None, description="CPU request and limit.")
    memory: Quantity | None = Field(None, description="Memory request and limit.")
    gpus: int = Field(0, description="NVIDIA GPUs (nvidia.com/gpu) per pod.", ge=0)
    efa: int = Field(
        0,
        description=(
            "AWS EFA interfaces (vpc.amazonaws.com/efa) per pod. Non-zero switches NIXL to "
            "LIBFABRIC with FI_PROVIDER=efa and adds IPC_LOCK."
        ),
        ge=0,
    )
    hugepages2_mi: Quantity | None = Field(
        None, alias="hugepages2Mi", description="2 MiB hugepages (hugepages-2Mi) per pod."
    )
    shm_size: Quantity = Field(
        "16Gi", description="Size of the in-memory /dev/shm volume (NCCL, NIXL staging)."
    )


class RoleSpec(_Model):
    """One role (prefill or decode): a StatefulSet with a headless Service."""

    replicas: int = Field(1, description="Number of engine pods in this role.", ge=1, le=INT32_MAX)
    replicas_from: Literal["Spec", "Scaler"] = Field(
        "Spec",
        description="Who owns this role's replica count. Spec: `replicas` above. Scaler: a "
        "DisaggregatedRoleScaler named `<name>-<role>`, which the operator creates (seeded from "
        "`replicas`) and whose scale subresource `kubectl scale`, an HPA or KEDA then drive; "
        "`replicas` is ignored from then on.",
    )
    tensor_parallel_size: int = Field(1, description="Tensor parallel size per pod.", ge=1)
    resources: RoleResources = Field(
        default_factory=lambda: RoleResources(), description="Compute, GPUs, EFA, hugepages."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods must match."
    )
    tolerations: FreeFormList = Field(
        default_factory=list, description="Kubernetes tolerations of the pods."
    )
    affinity: FreeForm = Field(
        default_factory=dict, description="Kubernetes affinity, merged with Boomerang's own."
    )
    prefix_caching: bool = Field(True, description="vLLM automatic prefix caching.")
    extra_args: list[str] = Field(
        default_factory=list, description="Extra vLLM arguments for this role."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra env for this role.")
    termination_grace_period_seconds: int = Field(
        120, description="Time a pod gets to drain in-flight requests.", ge=0
    )
    service_account_name: str | None = Field(
        None,
        description="ServiceAccount of the engine pods, e.g. one with an IAM role (IRSA) for "
        "s3:// models. Its token is mounted only when this is set.",
        min_length=1,
        max_length=253,
    )
    pod_template: PodTemplate = Field(
        default_factory=dict,
        description=(
            "Escape hatch: a partial PodTemplateSpec deep-merged over the generated one "
            "(containers and volumes merge by name)."
        ),
    )


class BreakEvenBounds(_Model):
    """Bounds on the learned pull/recompute break-even, in tokens of verified history."""

    min_tokens: int = Field(
        0,
        description="Never learn a break-even below this (kvTransfer.recomputeThreshold is "
        "always a floor on top).",
        ge=0,
    )
    max_tokens: int = Field(
        1_000_000,
        description="Never learn a break-even above this; at least minTokens.",
        ge=0,
    )


class ContinueOnDecodeSpec(_Model):
    """The third path: a turn goes straight to the D that holds its history and computes the
    new suffix there, with no P hop and no transfer, bounded by its cost to D's other streams."""

    enabled: bool = Field(True, description="Let the router take the continue-on-decode path.")
    max_suffix_tokens: int = Field(
        1024, description="Hard bound: longer new suffixes never continue on D.", ge=1
    )
    itl_budget: Duration = Field(
        "50ms",
        description="Continue only while D's estimated inter-token-latency cost of computing "
        "the suffix stays within this (positive).",
    )


class RetentionSpec(_Model):
    """How long the router keeps a conversation's blocks on D, learned from the gaps between
    turns; kvTransfer.decoderBlocksTTL stays the ceiling."""

    quantile_percent: int = Field(
        90,
        description="Keep a handle for this quantile of the learned gap between turns, in "
        "percent (50 to 99).",
        ge=50,
        le=99,
    )
    minimum: Duration = Field(
        "10s",
        description="Never release earlier than this; positive and below "
        "kvTransfer.decoderBlocksTTL.",
    )
    reuse_released: bool = Field(
        True,
        description="After releasing a conversation's blocks, keep its handle until the TTL "
        "for continuing on the same decoder: D's prefix cache holds freed blocks until it "
        "needs the room, and serves what it still has (never offered to prefill).",
    )
    max_client_ttl: Duration | None = Field(
        None,
        alias="maxClientTTL",
        description="The longest retention a client's hint may ask for (Anthropic "
        "cache_control ttl, OpenAI prompt_cache_retention), which replaces the learned one for "
        "its conversation; longer hints are capped and logged, never refused. Unset or 0: "
        "kvTransfer.decoderBlocksTTL. The router's conversation TTL still bounds every hint.",
    )


class TuningSpec(_Model):
    """How each turn picks its path (pull, recompute, continue on D) and how long D retains
    blocks. The router reloads this while running: a change here restarts no pod."""

    mode: Literal["Static", "Adaptive"] = Field(
        "Adaptive",
        description="Adaptive: the router learns the costs and the gaps between turns from its "
        "own observations and decides per turn (pull, recompute, or continue on the decoder "
        "that holds the history). Static: pull what P's own cache lacks when it reaches "
        "recomputeThreshold, and keep blocks for the TTLs.",
    )
    break_even: BreakEvenBounds = Field(
        default_factory=lambda: BreakEvenBounds(),
        description="Bounds on the learned pull/recompute break-even (Adaptive).",
    )
    continue_on_decode: ContinueOnDecodeSpec = Field(
        default_factory=lambda: ContinueOnDecodeSpec(),
        description="The continue-on-decode path and its bounds (Adaptive).",
    )
    retention: RetentionSpec = Field(
        default_factory=lambda: RetentionSpec(),
        description="Learned retention of D's blocks (Adaptive).",
    )
    decode_memory_budget_percent: int = Field(
        50,
        description="Percent of D's KV blocks that retained conversations may hold (Adaptive); "
        "beyond it the least likely to return are released first.",
        ge=1,
        le=100,
    )


class KVTransferSpec(_Model):
    """Bidirectional KV transfer: D keeps a turn's blocks so P can pull them next turn."""

    # Bidirectional reuse exists only in NIXL; the enum is the rule, and a CEL rule tying
    # `bidirectional` to the connector comes back when another connector is supported.
    connector: Literal["NixlConnector"] = Field(
        "NixlConnector", description="vLLM KV connector. Bidirectional reuse needs NIXL."
    )
    bidirectional: bool = Field(True, description="Let P pull D's blocks back (D->P READ).")
    recompute_threshold: int = Field(
        64, description="P recomputes when fewer tokens than this are reusable.", ge=0
    )
    decoder_blocks_ttl: Duration = Field(
        "480s",
        alias="decoderBlocksTTL",
        description="How long D pins a finished request's blocks for the next turn.",
    )
    lease_duration: Duration = Field(
        "30s", description="P's heartbeat-renewed lease on blocks D will pull."
    )
    backend: Literal["UCX", "LIBFABRIC"] | None = Field(
        None, description="NIXL backend; default LIBFABRIC when EFA is requested, else UCX."
    )
    load_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute", description="What P does when a KV read fails: recompute, or fail the request."
    )
    tuning: TuningSpec = Field(
        default_factory=lambda: TuningSpec(),
        description="Per-turn path choice and learned retention (Static or Adaptive); "
        "reloaded by the router while running, so a change restarts no pod.",
    )


class StoreSpec(_Model):
    """Where the router keeps conversations' KV handles."""

    type: Literal["memory", "redis"] = Field(
        "memory",
        description="memory: each router replica keeps the handles it stored, so with more "
        "than one replica the router's Service gets client-IP affinity (sessionAffinity: "
        "ClientIP) to send a client back to the replica holding its conversations. redis: "
        "shared by all replicas, no affinity, any replica serves any turn.",
    )
    url: str | None = Field(None, description="Redis URL, e.g. redis://redis:6379/0.", min_length=1)
    url_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key holding the Redis URL (preferred over url)."
    )


class RouterServiceSpec(_Model):
    """How clients reach the router."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        "ClusterIP", description="Kubernetes Service type."
    )
    port: int = Field(80, description="Service port.", ge=1, le=65535)
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations of the Service, e.g. the AWS load balancer's scheme or type.",
    )
    load_balancer_source_ranges: list[str] = Field(
        default_factory=list, description="CIDRs allowed to reach a LoadBalancer Service."
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Allow an internet-facing LoadBalancer without router.apiKeySecretRef. "
        "Off, such a resource is refused at admission: the router would be open to anyone.",
    )


class ContainerResources(_Model):
    """Requests and limits of the router container."""

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: {"cpu": "500m", "memory": "256Mi"}, description="Requests."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=lambda: {"memory": "1Gi"}, description="Limits."
    )


class RouterSpec(_Model):
    """The KV-cache-aware router in front of the engines."""

    replicas: int = Field(
        2,
        description="Router pods. Above 1 with the memory store (the default), the router's "
        "Service gets client-IP affinity: each client address stays on one replica for 3 hours "
        "(Kubernetes' default), so behind a proxy, NAT or a load balancer that hides client "
        "addresses all traffic may land on one replica, and a replica's restart costs its "
        "conversations one recomputed turn. Use store.type redis to spread turns instead.",
        ge=1,
        le=INT32_MAX,
    )
    image: str = Field(DEFAULT_ROUTER_IMAGE, description="Router image.", min_length=1)
    resources: ContainerResources = Field(
        default_factory=lambda: ContainerResources(), description="Router container resources."
    )
    store: StoreSpec = Field(
        default_factory=lambda: StoreSpec(),
        description="Conversation store of KV handles: memory (per replica; client-IP affinity "
        "with several replicas) or redis (shared).",
    )
    conversation_ttl: Duration | None = Field(
        None,
        alias="conversationTTL",
        description=(
            "How long the router offers a conversation's blocks; must stay more than 5s below "
            "kvTransfer.decoderBlocksTTL (P declines reads within 5s of D's deadline). Default: "
            "decoderBlocksTTL minus 5s minus a margin of max(5s, 10%)."
        ),
    )
    service: RouterServiceSpec = Field(
        default_factory=lambda: RouterServiceSpec(), description="The router's Service."
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key with API keys (one per line, optionally 'key tenant')."
    )
    session_headers: list[str] | None = Field(
        None,
        description="Request headers that name an agent's session, tried in order after the "
        "client's conversation_id and X-Conversation-Id and before the body's "
        "prompt_cache_key; a session names the conversation in the caller's tenant. Unset: "
        "x-claude-code-session-id, session_id, session-id, x-session-affinity, x-session-id. "
        "Empty: no header names a session.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the router pods must match."
    )
    tolerations: FreeFormList = Field(
        default_factory=list, description="Kubernetes tolerations of the router pods."
    )
    pod_template: PodTemplate = Field(
        default_factory=dict,
        description="Escape hatch: a partial PodTemplateSpec deep-merged over the router's.",
    )


class PlacementSpec(_Model):
    """Keep P and D close on the network, where KV crosses it."""

    topology_key: str | None = Field(
        None,
        description="Node label grouping close nodes, e.g. topology.k8s.aws/network-node-layer-3.",
        min_length=1,
    )
    required: bool = Field(
        False, description="Require (not just prefer) P and D in one topology domain."
    )


class DisaggregatedDeploymentSpec(_Model):
    """Desired state: the model, the engine, two roles, KV transfer, the router, placement."""

    model: ModelSpec = Field(description="The served model.")
    engine: EngineSpec = Field(
        default_factory=lambda: EngineSpec(), description="The engine image."
    )
    prefill: RoleSpec = Field(default_factory=lambda: RoleSpec(), description="The prefill role.")
    decode: RoleSpec = Field(default_factory=lambda: RoleSpec(), description="The decode role.")
    kv_transfer: KVTransferSpec = Field(
        default_factory=lambda: KVTransferSpec(), description="KV transfer between P and D."
    )
    router: RouterSpec = Field(default_factory=lambda: RouterSpec(), description="The router.")
    placement: PlacementSpec = Field(
        default_factory=lambda: PlacementSpec(), description="Network placement of P and D."
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> DisaggregatedDeploymentSpec:
        failed = [rule.message for rule in RULES if not rule.check(self)]
        if failed:
            raise ValueError("; ".join(failed))
        return self

    # Derived values: the one place each default that depends on other fields is computed.
    @property
    def efa(self) -> bool:
        return self.prefill.resources.efa > 0 or self.decode.resources.efa > 0

    @property
    def backend(self) -> Literal["UCX", "LIBFABRIC"]:
        if self.kv_transfer.backend:
            return self.kv_transfer.backend
        return "LIBFABRIC" if self.efa else "UCX"

    @property
    def router_ttl_seconds(self) -> float:
        if self.router.conversation_ttl is not None:
            return parse_duration(self.router.conversation_ttl)
        return float(default_handle_ttl(parse_duration(self.kv_transfer.decoder_blocks_ttl)))


T = TypeVar("T")


@dataclass(frozen=True)
class Rule(Generic[T]):
    """A validation rule: CEL for the API server, the same check in Python, one message."""

    cel: str
    message: str
    field_path: str
    check: Callable[[T], bool]


def _router_ttl_ok(s: DisaggregatedDeploymentSpec) -> bool:
    if s.router.conversation_ttl is None:
        return True
    ttl = duration_ns(s.router.conversation_ttl)
    return ttl + 5 * NS_PER_S < duration_ns(s.kv_transfer.decoder_blocks_ttl)


INTERNAL_LB_ANNOTATIONS = (
    ("service.beta.kubernetes.io/aws-load-balancer-scheme", "internal"),
    ("service.beta.kubernetes.io/aws-load-balancer-internal", "true"),
)
"""What makes an AWS load balancer internal (the AWS Load Balancer Controller's annotation,
and the in-tree cloud provider's); any other LoadBalancer Service is internet-facing."""


def _v(path: str) -> str:
    """CEL: the spec field at `path`, or its default where absent (see `cel`)."""
    return cel.value(DisaggregatedDeploymentSpec, path)


def _has(path: str) -> str:
    """CEL: the spec field at `path` and every object above it are set (see `cel`)."""
    return f"({cel.present(path)})"


def _well_formed(path: str) -> str:
    """CEL: the duration at `path` (or its default) matches the schema's pattern. The API server
    evaluates the rules even when a field fails its pattern, and `duration()` of such a string
    fails: a rule passes on it instead (the pattern's own error says what is wrong)."""
    return f"{_v(path)}.matches('{_DURATION_RE}')"


def _duration(path: str) -> str:
    return f"duration({_v(path)})"


_TUNING = "kvTransfer.tuning"
_TTL = "kvTransfer.decoderBlocksTTL"
_MIN = f"{_TUNING}.retention.minimum"
_ROUTER_TTL = "self.router.conversationTTL"
_ROUTER_TTL_SET = (
    f"({cel.present('router.conversationTTL')} && {_ROUTER_TTL}.matches('{_DURATION_RE}'))"
)
_ANNOTATIONS = "self.router.service.annotations"


def _gpus_rule(role: Role) -> Rule[DisaggregatedDeploymentSpec]:
    gpus, tp = _v(f"{role}.resources.gpus"), _v(f"{role}.tensorParallelSize")
    return Rule(
        cel=f"{gpus} == 0 || {gpus} % {tp} == 0",
        message=f"spec.{role}.resources.gpus must be a multiple of spec.{role}.tensorParallelSize",
        field_path=f".{role}.resources.gpus",
        check=lambda s: (
            getattr(s, role).resources.gpus % getattr(s, role).tensor_parallel_size == 0
        ),
    )


_TEMPLATE = "self.model.chatTemplate"


def _one_template_source(s: DisaggregatedDeploymentSpec) -> bool:
    ref = s.model.chat_template
    return ref is None or (ref.config_map_key_ref is None) != (ref.file is None)


def _template_file_ok(s: DisaggregatedDeploymentSpec) -> bool:
    ref = s.model.chat_template
    if ref is None or ref.file is None:
        return True
    return not ref.file.startswith("/") and ".." not in ref.file


RULES: tuple[Rule[DisaggregatedDeploymentSpec], ...] = (
    Rule(
        cel=f"!{_has('model.source')} || self.model.source.matches('{MODEL_SOURCE_RE}')",
        message=f"spec.model.source must be one of {MODEL_SOURCE_SHAPES} (without spaces)",
        field_path=".model.source",
        check=lambda s: model_source_error(s.model.source) is None,
    ),
    Rule(
        cel=f"!{_has('model.chatTemplate')} || "
        f"has({_TEMPLATE}.configMapKeyRef) != has({_TEMPLATE}.file)",
        message="spec.model.chatTemplate must set exactly one of configMapKeyRef and file",
        field_path=".model.chatTemplate",
        check=_one_template_source,
    ),
    Rule(
        cel=f"!{_has('model.chatTemplate.file')} || "
        f"(!{_TEMPLATE}.file.startsWith('/') && !{_TEMPLATE}.file.contains('..'))",
        message="spec.model.chatTemplate.file must be a path inside the model (relative, "
        "without ..)",
        field_path=".model.chatTemplate.file",
        check=_template_file_ok,
    ),
    Rule(
        cel=f"!{_has('model.chatTemplate.file')} || !{_has('model.source')} || "
        "!self.model.source.startsWith('s3://')",
        message="spec.model.chatTemplate.file cannot be read from an s3:// model: name a "
        "ConfigMap key (configMapKeyRef) instead",
        field_path=".model.chatTemplate.file",
        check=lambda s: (
            s.model.chat_template is None
            or s.model.chat_template.file is None
            or not s.model.source.startswith("s3://")
        ),
    ),
    Rule(
        cel=f"!{_ROUTER_TTL_SET} || duration({_ROUTER_TTL}) > duration('0s')",
        message="spec.router.conversationTTL must be positive",
        field_path=".router.conversationTTL",
        check=lambda s: (
            s.router.conversation_ttl is None or duration_ns(s.router.conversation_ttl) > 0
        ),
    ),
    Rule(
        cel=f"!({_ROUTER_TTL_SET} && {_well_formed(_TTL)}) || "
        f"duration({_ROUTER_TTL}) + duration('5s') < {_duration(_TTL)}",
        message="spec.router.conversationTTL must be more than 5s below "
        "spec.kvTransfer.decoderBlocksTTL",
        field_path=".router.conversationTTL",
        check=_router_ttl_ok,
    ),
    Rule(
        cel=f"!{_well_formed(_TTL)} || {_duration(_TTL)} >= duration('30s')",
        message="spec.kvTransfer.decoderBlocksTTL must be at least 30s",
        field_path=".kvTransfer.decoderBlocksTTL",
        check=lambda s: duration_ns(s.kv_transfer.decoder_blocks_ttl) >= 30 * NS_PER_S,
    ),
    Rule(
        cel=f"!{_well_formed('kvTransfer.leaseDuration')} || "
        f"{_duration('kvTransfer.leaseDuration')} >= duration('1s')",
        message="spec.kvTransfer.leaseDuration must be at least 1s",
        field_path=".kvTransfer.leaseDuration",
        check=lambda s: duration_ns(s.kv_transfer.lease_duration) >= NS_PER_S,
    ),
    Rule(
        cel=f"({_v('prefill.resources.efa')} == 0 && {_v('decode.resources.efa')} == 0) || "
        f"!{_has('kvTransfer.backend')} || self.kvTransfer.backend == 'LIBFABRIC'",
        message="spec.kvTransfer.backend must be LIBFABRIC when EFA interfaces are requested "
        "(UCX silently falls back to TCP on EFA)",
        field_path=".kvTransfer.backend",
        check=lambda s: not s.efa or s.kv_transfer.backend in (None, "LIBFABRIC"),
    ),
    Rule(
        cel=f"{_v('router.store.type')} != 'redis' || {_has('router.store.url')} || "
        f"{_has('router.store.urlSecretRef')}",
        message="spec.router.store.url or spec.router.store.urlSecretRef is required when "
        "spec.router.store.type is redis",
        field_path=".router.store",
        check=lambda s: (
            s.router.store.type != "redis"
            or s.router.store.url is not None
            or s.router.store.url_secret_ref is not None
        ),
    ),
    Rule(
        cel=f"!({_has('router.store.url')} && {_has('router.store.urlSecretRef')})",
        message="spec.router.store.url and spec.router.store.urlSecretRef are mutually exclusive",
        field_path=".router.store",
        check=lambda s: s.router.store.url is None or s.router.store.url_secret_ref is None,
    ),
    Rule(
        cel=f"{_v('router.service.type')} != 'LoadBalancer' || {_has('router.apiKeySecretRef')} "
        f"|| {_v('router.service.allowUnauthenticated')} || "
        f"({_has('router.service.annotations')} && ("
        + " || ".join(
            f"('{key}' in {_ANNOTATIONS} && {_ANNOTATIONS}['{key}'] == '{value}')"
            for key, value in INTERNAL_LB_ANNOTATIONS
        )
        + "))",
        message="spec.router.apiKeySecretRef is required for an internet-facing LoadBalancer "
        "(or set spec.router.service.allowUnauthenticated)",
        field_path=".router.apiKeySecretRef",
        check=lambda s: (
            s.router.service.type != "LoadBalancer"
            or s.router.api_key_secret_ref is not None
            or s.router.service.allow_unauthenticated
            or any(s.router.service.annotations.get(k) == v for k, v in INTERNAL_LB_ANNOTATIONS)
        ),
    ),
    Rule(
        cel=f"!{_v('model.cache.persistent')} || {_has('model.cache.size')}",
        message="spec.model.cache.size is required when spec.model.cache.persistent is true",
        field_path=".model.cache.size",
        check=lambda s: not s.model.cache.persistent or s.model.cache.size is not None,
    ),
    Rule(
        cel=f"!{_v('placement.required')} || {_has('placement.topologyKey')}",
        message="spec.placement.topologyKey is required when spec.placement.required is true",
        field_path=".placement.topologyKey",
        check=lambda s: not s.placement.required or s.placement.topology_key is not None,
    ),
    Rule(
        cel=f"{_v(f'{_TUNING}.breakEven.minTokens')} <= {_v(f'{_TUNING}.breakEven.maxTokens')}",
        message="spec.kvTransfer.tuning.breakEven.minTokens must not exceed "
        "spec.kvTransfer.tuning.breakEven.maxTokens",
        field_path=".kvTransfer.tuning.breakEven.minTokens",
        check=lambda s: (
            s.kv_transfer.tuning.break_even.min_tokens <= s.kv_transfer.tuning.break_even.max_tokens
        ),
    ),
    Rule(
        cel=f"!{_well_formed(f'{_TUNING}.continueOnDecode.itlBudget')} || "
        f"{_duration(f'{_TUNING}.continueOnDecode.itlBudget')} > duration('0s')",
        message="spec.kvTransfer.tuning.continueOnDecode.itlBudget must be positive",
        field_path=".kvTransfer.tuning.continueOnDecode.itlBudget",
        check=lambda s: duration_ns(s.kv_transfer.tuning.continue_on_decode.itl_budget) > 0,
    ),
    Rule(
        cel=f"!{_well_formed(_MIN)} || {_duration(_MIN)} > duration('0s')",
        message="spec.kvTransfer.tuning.retention.minimum must be positive",
        field_path=".kvTransfer.tuning.retention.minimum",
        check=lambda s: duration_ns(s.kv_transfer.tuning.retention.minimum) > 0,
    ),
    Rule(
        cel=f"!({_well_formed(_MIN)} && {_well_formed(_TTL)}) || "
        f"{_duration(_MIN)} < {_duration(_TTL)}",
        message="spec.kvTransfer.tuning.retention.minimum must be below "
        "spec.kvTransfer.decoderBlocksTTL (the ceiling of retention)",
        field_path=".kvTransfer.tuning.retention.minimum",
        check=lambda s: (
            duration_ns(s.kv_transfer.tuning.retention.minimum)
            < duration_ns(s.kv_transfer.decoder_blocks_ttl)
        ),
    ),
    _gpus_rule("prefill"),
    _gpus_rule("decode"),
)
"""Rules across the spec's fields, checked by the API server at the spec (CEL) and by the
model. Every field a rule reads goes through `_v` or `_has`, so no rule fails to evaluate on a
field the object lacks."""

_DNS_1035_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"

_NAME_SET = f"({cel.present('metadata.name')})"

NAME_RULES: tuple[Rule[str], ...] = (
    Rule(
        cel=f"!{_NAME_SET} || self.metadata.name.size() <= {MAX_NAME_LENGTH}",
        message=f"metadata.name must be at most {MAX_NAME_LENGTH} characters (its StatefulSets' "
        f"pod names and labels add {DNS_LABEL_MAX - MAX_NAME_LENGTH} and must fit in 63)",
        field_path=".metadata.name",
        check=lambda name: len(name) <= MAX_NAME_LENGTH,
    ),
    Rule(
        cel=f"!{_NAME_SET} || self.metadata.name.matches('{_DNS_1035_LABEL}')",
        message="metadata.name must start with a letter and contain no dots: it names "
        "Services, which are DNS-1035 labels",
        field_path=".metadata.name",
        check=lambda name: re.fullmatch(_DNS_1035_LABEL, name) is not None,
    ),
)
"""Rules on the resource's own name, which the API server checks at the schema's root."""


class RoleStatus(_Model):
    """Observed replicas of one role."""

    desired: int = Field(0, description="Replicas asked for.")
    ready: int = Field(0, description="Replicas ready to serve.")
    updated: int = Field(0, description="Replicas running the current revision.")
    scaler: str | None = Field(
        None, description="The DisaggregatedRoleScaler `desired` comes from (replicasFrom: Scaler)."
    )


class RouterStatus(_Model):
    """Observed state of the router."""

    desired: int = Field(0, description="Router replicas asked for.")
    ready: int = Field(0, description="Router replicas ready.")
    url: str | None = Field(None, description="In-cluster URL of the OpenAI-compatible API.")


class PathShares(_Model):
    """How the router served its turns: percent of turns per path."""

    pull: int = Field(description="Percent of turns that pulled the history from D.")
    recompute: int = Field(description="Percent of turns P computed in full.")
    continue_: int = Field(
        alias="continue", description="Percent of turns that continued on the D holding them."
    )


class EffectiveKVTransfer(_Model):
    """The kv-transfer settings the engines and router actually run with, defaults resolved."""

    bidirectional: bool = Field(description="D->P reuse enabled.")
    recompute_threshold: int = Field(description="Tokens below which P recomputes.")
    decoder_blocks_ttl_seconds: int = Field(
        alias="decoderBlocksTTLSeconds", description="D's block retention in seconds."
    )
    lease_duration_seconds: int = Field(description="P's lease in seconds.")
    router_conversation_ttl_seconds: int = Field(
        alias="routerConversationTTLSeconds", description="Router's handle TTL in seconds."
    )
    backend: str = Field(description="NIXL backend in use.")
    load_failure_policy: str = Field(description="P's policy on failed KV reads.")
    mode: str = Field(description="Tuning mode in force: Static or Adaptive.")
    break_even_tokens: int | None = Field(
        None,
        description="Adaptive: the learned pull/recompute break-even, in history tokens "
        "(read from the router).",
    )
    retention_seconds: int | None = Field(
        None, description="Adaptive: how long the router now keeps a handle on D, learned."
    )
    path_shares: PathShares | None = Field(
        None, description="Adaptive: percent of turns per path since the router started."
    )
    retained_blocks: int | None = Field(
        None, description="Adaptive: KV blocks retained handles hold on D (the memory held)."
    )
    retained_percent: int | None = Field(
        None, description="Adaptive: those blocks as a percent of D's KV blocks."
    )
    observed_at: str | None = Field(
        None,
        description="Adaptive: when the router reported these learned values (RFC 3339); kept "
        "while they stay the same, so a settled router writes no status.",
    )


class Condition(_Model):
    """A standard Kubernetes condition."""

    type: str = Field(
        description="Ready, Progressing, Degraded, and kstatus' Reconciling and Stalled."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int = Field(0, description="Generation the condition was computed for.")


class DisaggregatedDeploymentStatus(_Model):
    """Observed state, written only by the operator."""

    observed_generation: int = Field(0, description="Last spec generation reconciled.")
    prefill: RoleStatus = Field(
        default_factory=lambda: RoleStatus(), description="Prefill replicas."
    )
    decode: RoleStatus = Field(default_factory=lambda: RoleStatus(), description="Decode replicas.")
    router: RouterStatus = Field(
        default_factory=lambda: RouterStatus(), description="Router state."
    )
    kv_transfer: EffectiveKVTransfer | None = Field(
        None, description="Effective kv-transfer settings."
    )
    engine_revision: str | None = Field(
        None, description="Hash of the engine build both roles must run."
    )
    revision_skew: bool = Field(
        False, description="True while P and D run different engine revisions (mid-rollout)."
    )
    ready_generation: int | None = Field(
        None,
        description="The last generation at which every replica was ready: replicas missing "
        "at that generation are a fault (Degraded), at a newer one a change under way.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Degraded; Reconciling and Stalled mirror the last two.",
    )


class DisaggregatedDeployment(_Model):
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
