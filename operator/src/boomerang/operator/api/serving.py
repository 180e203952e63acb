"""What the engines serve and how each role runs: the model, the engine image, the two roles'
pods (compute, GPUs, EFA, hugepages, scheduling) and their network placement.

Why a module of its own: these are the types the pod builders (`engines.py`) read; the
kv-transfer and router settings, which the builders pass on as configuration, live apart.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from boomerang.connector.config import MODEL_SOURCE_SHAPES
from boomerang.operator.api.fields import FreeForm, FreeFormList, Model, PodTemplate, Quantity
from boomerang.operator.api.names import DEFAULT_ENGINE_IMAGE, DNS_SUBDOMAIN_MAX, INT32_MAX

MAX_MODEL_SOURCE_LENGTH = 2048
"""An S3 key alone may be 1,024 bytes; a bound lets the API server cost the CEL rule."""


class EnvVar(Model):
    """One environment variable, as in a Kubernetes container."""

    name: str = Field(description="Variable name.", min_length=1)
    value: str | None = Field(None, description="Literal value.")
    value_from: FreeForm | None = Field(
        None, description="A Kubernetes EnvVarSource (secretKeyRef, fieldRef, ...)."
    )


class ModelCache(Model):
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


class ConfigMapKeyRef(Model):
    """A key inside a ConfigMap in the resource's namespace."""

    name: str = Field(description="ConfigMap name.", min_length=1, max_length=DNS_SUBDOMAIN_MAX)
    key: str = Field(
        description="Key inside the ConfigMap (the template file's name in the pod).",
        pattern=r"^[-._a-zA-Z0-9]+$",
        max_length=253,
    )


class ChatTemplateRef(Model):
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


class ModelSpec(Model):
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


class EngineSpec(Model):
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


class RoleResources(Model):
    """Compute one engine pod gets; EFA and hugepages are first-class, not hidden in overrides."""

    cpu: Quantity | None = Field(None, description="CPU request and limit.")
    memory: Quantity | None = Field(None, description="Memory request and limit.")
    gpus: int = Field(0, description="NVIDIA GPUs (nvidia.com/gpu) per pod.", ge=0)
    efa: int = Field(
        0,
        description=(
            "AWS EFA interfaces (vpc.amazonaws.com/efa) per pod. Non-zero switches NIXL to "
            "LIBFABRIC with FI_PROVIDER=efa and adds IPC_LOCK (spec.efa.privileged: a "
            "privileged container). Both roles or neither: P and D transfer over one fabric."
        ),
        ge=0,
    )
    hugepages2_mi: Quantity | None = Field(
        None, alias="hugepages2Mi", description="2 MiB hugepages (hugepages-2Mi) per pod."
    )
    shm_size: Quantity = Field(
        "16Gi", description="Size of the in-memory /dev/shm volume (NCCL, NIXL staging)."
    )


class EfaSpec(Model):
    """How the engine pods use AWS EFA, for both roles (the interfaces themselves are each role's
    `resources.efa`)."""

    privileged: bool = Field(
        False,
        description="Run the engine containers privileged when EFA is requested. Off, they get "
        "IPC_LOCK only. Needed where NIXL's LIBFABRIC backend cannot register GPU memory with "
        "the EFA NIC unprivileged (libfabric's fi_mr_reg fails: the status then says Degraded, "
        "EFAMemoryRegistrationFailed), which recipes tie to the container's access to the "
        "GDRCopy device (/dev/gdrdrv) and to locked-memory limits. Ignored without EFA.",
    )


class RoleSpec(Model):
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


class PlacementSpec(Model):
    """Keep P and D close on the network, where KV crosses it."""

    topology_key: str | None = Field(
        None,
        description="Node label grouping close nodes, e.g. topology.k8s.aws/network-node-layer-3.",
        min_length=1,
    )
    required: bool = Field(
        False, description="Require (not just prefer) P and D in one topology domain."
    )
