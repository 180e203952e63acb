"""Resolve a `DisaggregatedDeployment` into the settings each component runs with.

These are the decisions shared by the Kubernetes builders and the local runtime
(`boomerang up`): names, labels, the engine's vLLM arguments and environment, the router's
configuration. Builders turn them into Kubernetes objects; the local runtime turns them into
processes. Both call the same functions, so a local stack runs exactly what the operator renders.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from boomerang.connector import config as connector
from boomerang.connector.config import EngineSettings, KVTransferSettings
from boomerang.facts import engine as names
from boomerang.facts import state as router_state
from boomerang.facts.engine import Role
from boomerang.operator.api import DisaggregatedDeployment, EnvVar, RoleSpec, parse_duration

MANAGER = "boomerang-operator"
ROUTER_PORT = 8080
ROUTER_PRESTOP_S = 5
"""A stopping router pod keeps serving this long before its SIGTERM: its Service's endpoints
(kube-proxy, a load balancer's targets) stop sending to it meanwhile."""
ROUTER_EXIT_MARGIN_S = 5
"""Of a router pod's grace period, left after its drain for closing and exiting."""
ROUTER_CONFIG_KEY = "router.yaml"
ROUTER_CONFIG_DIR = "/etc/boomerang"
API_KEYS_DIR = "/etc/boomerang/api-keys"
MODELS_DIR = "/models"
CHAT_TEMPLATE_DIR = "/etc/boomerang/chat-template"
"""Where a chat template from a ConfigMap key is mounted in every engine pod."""
MODEL_FILE = "model://"
"""How an engine argument names a file in the model (the entrypoint resolves it)."""

LEASE_TOKEN_ENV = names.LEASE_TOKEN_ENV
"""Where engines (their lease API) and the router read the lease token."""
LEASE_TOKEN_KEY = "token"

LABEL_DEPLOYMENT = "boomerang.dev/deployment"
LABEL_ROLE = "boomerang.dev/role"
ANNOTATION_CONFIG_HASH = "boomerang.dev/config-hash"
ANNOTATION_ENGINE_REVISION = "boomerang.dev/engine-revision"


def role_spec(dd: DisaggregatedDeployment, role: Role) -> RoleSpec:
    return dd.spec.prefill if role == "prefill" else dd.spec.decode


def child_name(dd: DisaggregatedDeployment, component: str) -> str:
    """`<name>-prefill`, `<name>-decode`, `<name>-router`: one name per component."""
    return f"{dd.name}-{component}"


def selector_labels(dd: DisaggregatedDeployment, component: str) -> dict[str, str]:
    """The immutable labels that select one component's pods."""
    return {LABEL_DEPLOYMENT: dd.name, LABEL_ROLE: component}


def labels(dd: DisaggregatedDeployment, component: str) -> dict[str, str]:
    """Recommended Kubernetes labels plus the selector labels."""
    return {
        "app.kubernetes.io/name": "boomerang",
        "app.kubernetes.io/instance": dd.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGER,
        **selector_labels(dd, component),
    }


def stable_hash(value: Any) -> str:
    """A short content hash of any JSON-able value (used to roll pods on change)."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def kv_settings(dd: DisaggregatedDeployment, role: Role) -> KVTransferSettings:
    """The kv-transfer settings of one role, defaults resolved."""
    kv = dd.spec.kv_transfer
    gpus = role_spec(dd, role).resources.gpus
    return KVTransferSettings(
        bidirectional=kv.bidirectional,
        recompute_threshold=kv.recompute_threshold,
        decoder_blocks_ttl_s=kv.decoder_blocks_ttl_s,
        lease_duration_s=kv.lease_duration_s,
        backend=dd.spec.backend,
        load_failure_policy=kv.load_failure_policy,
        buffer_device="cuda" if gpus > 0 else "cpu",
    )


def engine_settings(dd: DisaggregatedDeployment, role: Role) -> EngineSettings:
    """What one role's engine serves, with the model URI left for the entrypoint to resolve."""
    spec = role_spec(dd, role)
    model = dd.spec.model
    return EngineSettings(
        model=model.source,
        served_model_name=model.served_name,
        max_model_len=model.max_model_len,
        dtype=model.dtype,
        tensor_parallel_size=spec.tensor_parallel_size,
        prefix_caching=spec.prefix_caching,
        tool_call_parser=model.tool_call_parser,
        reasoning_parser=model.reasoning_parser,
        chat_template=chat_template_path(dd),
        extra_args=tuple(dd.spec.engine.extra_args) + tuple(spec.extra_args),
    )


def chat_template_path(dd: DisaggregatedDeployment) -> str | None:
    """The chat template as the engine's `--chat-template` names it: the mounted ConfigMap
    key's file, or `model://<file>` (resolved by the entrypoint); None: the model's own."""
    ref = dd.spec.model.chat_template
    if ref is None:
        return None
    if ref.config_map_key_ref is not None:
        return f"{CHAT_TEMPLATE_DIR}/{ref.config_map_key_ref.key}"
    return f"{MODEL_FILE}{ref.file}"


def engine_args(dd: DisaggregatedDeployment, role: Role, **overrides: Any) -> list[str]:
    """vLLM's arguments for one role; `overrides` replace engine settings (the local runtime
    listens on its own host and port)."""
    settings = dataclasses.replace(engine_settings(dd, role), **overrides)
    return connector.engine_args(role, settings, kv_settings(dd, role))


def engine_env(dd: DisaggregatedDeployment, role: Role) -> dict[str, str]:
    """Literal env of one role's engine: connector env and the engine revision (which the
    engine publishes, so the router can pair P and D of one revision), then the user's (user
    wins)."""
    env = connector.engine_env(role, kv_settings(dd, role), efa=dd.spec.uses_efa)
    env[names.ENGINE_REVISION_ENV] = engine_revision(dd)
    for var in user_env(dd, role):
        if var.value is not None:
            env[var.name] = var.value
    return env


def user_env(dd: DisaggregatedDeployment, role: Role) -> list[EnvVar]:
    return list(dd.spec.engine.env) + list(role_spec(dd, role).env)


def engine_revision(dd: DisaggregatedDeployment) -> str:
    """What P and D must agree on to work together: the engine build and the connector
    protocol (to handshake), and how a prompt is rendered (D decodes on P's KV of P's
    rendering, and the router verifies reuse on P's): the chat template and the parsers.

    Both roles' pod templates carry it, so changing it rolls both roles together, and the
    router pairs P and D of one revision while both run.
    """
    kv, model = dd.spec.kv_transfer, dd.spec.model
    template = model.chat_template
    rendering = [
        template.model_dump(by_alias=True, exclude_none=True) if template else None,
        model.tool_call_parser,
        model.reasoning_parser,
    ]
    parts: list[Any] = [dd.spec.engine.image, kv.connector, kv.bidirectional, dd.spec.backend]
    if any(part is not None for part in rendering):  # unset: the revision of before these fields
        parts.append(rendering)
    return stable_hash(parts)


def router_config(
    dd: DisaggregatedDeployment,
    prefill: dict[str, Any] | None = None,
    decode: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The router's configuration file, as the router reads it; endpoints default to the roles'
    headless Services.

    A plain document, not the router's own model: the operator ships configuration to the
    router and never imports it. The operator's tests validate every rendered document with
    the router's `RouterConfig`, so the two cannot drift apart unnoticed.
    """

    def discovered(role: Role) -> dict[str, Any]:
        service = {"namespace": dd.namespace, "service": child_name(dd, role)}
        return {"kubernetes": {**service, "port": names.HTTP_PORT}}

    store = dd.spec.router.store
    config: dict[str, Any] = {
        "listen_port": ROUTER_PORT,
        "model": dd.spec.model.served_name,
        "prefill": prefill or discovered("prefill"),
        "decode": decode or discovered("decode"),
        "bidirectional": dd.spec.kv_transfer.bidirectional,
        "prefill_prefix_caching": role_spec(dd, "prefill").prefix_caching,
        "decoder_blocks_ttl_s": float(dd.spec.kv_transfer.decoder_blocks_ttl_s),
        "recompute_threshold": dd.spec.kv_transfer.recompute_threshold,
        "handle_ttl_s": dd.spec.router_ttl_seconds,
        "store": {"kind": store.type, "url": store.url or _secret_placeholder(store.type)},
        "api_keys_file": _api_keys_file(dd),
        "session_headers": dd.spec.router.session_headers,
        "migrate_streams": dd.spec.router.migrate_streams,
        "shutdown_drain_s": router_drain_s(dd),
        "tenant_cache_salt": dd.spec.router.isolate_tenant_caches,
        "tuning": router_tuning(dd),
    }
    return _without_none(config)


def router_drain_s(dd: DisaggregatedDeployment) -> int:
    """How long a router told to stop lets its turns in flight finish: its pod's grace period
    less the preStop delay and the exit margin."""
    grace = dd.spec.router.termination_grace_period_seconds
    return grace - ROUTER_PRESTOP_S - ROUTER_EXIT_MARGIN_S


ROUTER_RELOADED_KEYS = frozenset({"tuning"})
"""Sections of the router's configuration it reloads from its mounted file while running:
left out of the router pods' config hash, so changing them restarts no pod."""


def router_tuning(dd: DisaggregatedDeployment) -> dict[str, Any]:
    """The router's `tuning` section: modes lowercased, durations in seconds, percents as
    fractions."""
    tuning = dd.spec.kv_transfer.tuning
    cont, retention = tuning.continue_on_decode, tuning.retention
    section = {
        "mode": tuning.router_mode,
        "break_even_min_tokens": tuning.break_even.min_tokens,
        "break_even_max_tokens": tuning.break_even.max_tokens,
        "continue_on_decode": cont.enabled,
        "continue_max_suffix_tokens": cont.max_suffix_tokens,
        "itl_budget_s": _seconds_or_none(cont.itl_budget),
        "slo_aware": tuning.slo.enabled,
        "slo_scale": tuning.slo.scale,
        "ttft_slo_s": _seconds_or_none(tuning.slo.ttft),
        "tpot_slo_s": _seconds_or_none(tuning.slo.tpot),
        "retention_quantile": retention.quantile_percent / 100,
        "retention_min_s": parse_duration(retention.minimum),
        "reuse_released": retention.reuse_released,
        "decode_memory_budget": tuning.decode_memory_budget_percent / 100,
        "retention_max_client_s": _seconds_or_none(retention.max_client_ttl),
    }
    return _without_none(section)


def _seconds_or_none(duration: str | None) -> float | None:
    """Seconds of an optional duration; None when unset or zero (the router's default)."""
    seconds = parse_duration(duration) if duration else 0
    return seconds or None


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    """Unset keys are left out, so the router's own defaults apply."""
    return {
        k: _without_none(v) if isinstance(v, dict) else v for k, v in data.items() if v is not None
    }


def _secret_placeholder(store_type: str) -> str | None:
    """A redis URL that comes from a Secret is injected as BOOMERANG_REDIS_URL at run time."""
    return "redis://from-env" if store_type == "redis" else None


def _api_keys_file(dd: DisaggregatedDeployment) -> str | None:
    ref = dd.spec.router.api_key_secret_ref
    return f"{API_KEYS_DIR}/{ref.key}" if ref else None


def _router_base(dd: DisaggregatedDeployment) -> str:
    port = dd.spec.router.service.port
    return f"http://{child_name(dd, 'router')}.{dd.namespace}.svc:{port}"


def router_url(dd: DisaggregatedDeployment) -> str:
    return f"{_router_base(dd)}/v1"


def router_state_url(dd: DisaggregatedDeployment) -> str:
    """What the router has learned (Adaptive tuning), read by the operator for status."""
    return f"{_router_base(dd)}{router_state.PATH}"


def lease_token_secret(dd: DisaggregatedDeployment) -> str:
    """`<name>-lease-token`: the Secret whose token lets the router control D's leases."""
    return child_name(dd, "lease-token")


def lease_token_env(dd: DisaggregatedDeployment) -> dict[str, Any]:
    """The env var that gives a container the lease token, from its Secret: the token's value
    never appears in a pod template, so it never changes a config hash."""
    ref = {"name": lease_token_secret(dd), "key": LEASE_TOKEN_KEY}
    return {"name": LEASE_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}
