"""Cross-field rules: each is CEL for the API server (admission) and the same check in Python.

Why a module of its own: kubebuilder keeps validation markers apart from the types they
guard; here a rule is data (`Rule`: its CEL, its message, the field it names, its Python
check), generated into the CRD's `x-kubernetes-validations` and run by the spec's validator,
so the operator and the local runtime refuse what the API server would, with the same message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from boomerang import facts
from boomerang.connector.config import MODEL_SOURCE_RE, MODEL_SOURCE_SHAPES, model_source_error
from boomerang.facts.engine import Role
from boomerang.operator import cel
from boomerang.operator.api.durations import DURATION_RE, NS_PER_S, duration_ns
from boomerang.operator.api.names import DNS_LABEL_MAX, MAX_NAME_LENGTH
from boomerang.operator.api.router import DECLINE_WINDOW
from boomerang.operator.api.spec import SpecFields

T = TypeVar("T")


@dataclass(frozen=True)
class Rule(Generic[T]):
    """A validation rule: CEL for the API server, the same check in Python, one message."""

    cel: str
    message: str
    field_path: str
    check: Callable[[T], bool]


def _router_ttl_ok(s: SpecFields) -> bool:
    if s.router.conversation_ttl is None:
        return True
    ttl = duration_ns(s.router.conversation_ttl)
    window = facts.P_DECLINE_WINDOW_S * NS_PER_S
    return ttl + window < duration_ns(s.kv_transfer.decoder_blocks_ttl)


INTERNAL_LB_ANNOTATIONS = (
    ("service.beta.kubernetes.io/aws-load-balancer-scheme", "internal"),
    ("service.beta.kubernetes.io/aws-load-balancer-internal", "true"),
)
"""What makes an AWS load balancer internal (the AWS Load Balancer Controller's annotation,
and the in-tree cloud provider's); any other LoadBalancer Service is internet-facing."""


def _v(path: str) -> str:
    """CEL: the spec field at `path`, or its default where absent (see `cel`)."""
    return cel.value(SpecFields, path)


def _has(path: str) -> str:
    """CEL: the spec field at `path` and every object above it are set (see `cel`)."""
    return f"({cel.present(path)})"


def _well_formed(path: str) -> str:
    """CEL: the duration at `path` (or its default) matches the schema's pattern. The API server
    evaluates the rules even when a field fails its pattern, and `duration()` of such a string
    fails: a rule passes on it instead (the pattern's own error says what is wrong)."""
    return f"{_v(path)}.matches('{DURATION_RE}')"


def _duration(path: str) -> str:
    return f"duration({_v(path)})"


_TUNING = "kvTransfer.tuning"
_TTL = "kvTransfer.decoderBlocksTTL"
_MIN = f"{_TUNING}.retention.minimum"
_ROUTER_TTL = "self.router.conversationTTL"
_ROUTER_TTL_SET = (
    f"({cel.present('router.conversationTTL')} && {_ROUTER_TTL}.matches('{DURATION_RE}'))"
)
_ANNOTATIONS = "self.router.service.annotations"


def _positive_rule(field: str, get: Callable[[SpecFields], str | None]) -> Rule[SpecFields]:
    """An optional duration under the tuning section that must be positive when set."""
    path = f"{_TUNING}.{field}"
    value = f"self.{path}"
    is_set = f"({cel.present(path)} && {value}.matches('{DURATION_RE}'))"
    return Rule(
        cel=f"!{is_set} || duration({value}) > duration('0s')",
        message=f"spec.{path} must be positive",
        field_path=f".{path}",
        check=lambda s: (d := get(s)) is None or duration_ns(d) > 0,
    )


def _gpus_rule(role: Role) -> Rule[SpecFields]:
    gpus, tp = _v(f"{role}.resources.gpus"), _v(f"{role}.tensorParallelSize")
    return Rule(
        cel=f"{gpus} == 0 || {gpus} % {tp} == 0",
        message=f"spec.{role}.resources.gpus must be a multiple of spec.{role}.tensorParallelSize",
        field_path=f".{role}.resources.gpus",
        check=lambda s: (
            getattr(s, role).resources.gpus % getattr(s, role).tensor_parallel_size == 0
        ),
    )


def _hugepages_rule(role: Role) -> Rule[SpecFields]:
    resources = f"{role}.resources"
    return Rule(
        cel=f"!{_has(f'{resources}.hugepages2Mi')} || {_has(f'{resources}.memory')} || "
        f"{_has(f'{resources}.cpu')}",
        message=f"spec.{role}.resources.hugepages2Mi needs spec.{role}.resources.memory or cpu: "
        "Kubernetes refuses hugepages in a container without a cpu or memory request",
        field_path=f".{role}.resources.hugepages2Mi",
        check=lambda s: (
            getattr(s, role).resources.hugepages2_mi is None
            or getattr(s, role).resources.memory is not None
            or getattr(s, role).resources.cpu is not None
        ),
    )


_TEMPLATE = "self.model.chatTemplate"


def _one_template_source(s: SpecFields) -> bool:
    ref = s.model.chat_template
    return ref is None or (ref.config_map_key_ref is None) != (ref.file is None)


def _template_file_ok(s: SpecFields) -> bool:
    ref = s.model.chat_template
    if ref is None or ref.file is None:
        return True
    return not ref.file.startswith("/") and ".." not in ref.file


RULES: tuple[Rule[SpecFields], ...] = (
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
        f"duration({_ROUTER_TTL}) + duration('{DECLINE_WINDOW}') < {_duration(_TTL)}",
        message=f"spec.router.conversationTTL must be more than {DECLINE_WINDOW} below "
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
        cel=f"({_v('prefill.resources.efa')} == 0) == ({_v('decode.resources.efa')} == 0)",
        message="spec.prefill.resources.efa and spec.decode.resources.efa must both be 0 or both "
        "be non-zero: with EFA on either, both roles run NIXL's LIBFABRIC backend over EFA, which "
        "fails to start on a role without EFA interfaces",
        field_path=".decode.resources.efa",
        check=lambda s: (s.prefill.resources.efa == 0) == (s.decode.resources.efa == 0),
    ),
    Rule(
        cel=f"({_v('prefill.resources.efa')} == 0 && {_v('decode.resources.efa')} == 0) || "
        f"!{_has('kvTransfer.backend')} || self.kvTransfer.backend == 'LIBFABRIC'",
        message="spec.kvTransfer.backend must be LIBFABRIC when EFA interfaces are requested "
        "(UCX silently falls back to TCP on EFA)",
        field_path=".kvTransfer.backend",
        check=lambda s: not s.uses_efa or s.kv_transfer.backend in (None, "LIBFABRIC"),
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
    _positive_rule(
        "continueOnDecode.itlBudget", lambda s: s.kv_transfer.tuning.continue_on_decode.itl_budget
    ),
    _positive_rule("slo.ttft", lambda s: s.kv_transfer.tuning.slo.ttft),
    _positive_rule("slo.tpot", lambda s: s.kv_transfer.tuning.slo.tpot),
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
    _hugepages_rule("prefill"),
    _hugepages_rule("decode"),
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
