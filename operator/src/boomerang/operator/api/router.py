"""The KV-cache-aware router in front of the engines: its replicas, store, Service and keys.

Why a module of its own: the router is a Deployment of its own with settings of its own; none
of them changes an engine pod.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from boomerang import facts
from boomerang.operator.api.durations import Duration
from boomerang.operator.api.fields import FreeFormList, Model, PodTemplate, Quantity
from boomerang.operator.api.names import DEFAULT_ROUTER_IMAGE, INT32_MAX

DECLINE_WINDOW = facts.seconds(facts.P_DECLINE_WINDOW_S)
"""P's decline window as a spec duration: a conversation's handle must keep clear of D's
deadline by more than this (the description below and `rules.py`'s CEL rule)."""
_MARGIN = f"max({facts.seconds(facts.HANDLE_MARGIN_MIN_S)}, {facts.HANDLE_MARGIN_SHARE:.0%})"


class SecretKeyRef(Model):
    """A key inside a Secret in the resource's namespace."""

    name: str = Field(description="Secret name.", min_length=1)
    key: str = Field(description="Key inside the Secret.", min_length=1)


class StoreSpec(Model):
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


class RouterServiceSpec(Model):
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


class ContainerResources(Model):
    """Requests and limits of the router container."""

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: {"cpu": "500m", "memory": "256Mi"}, description="Requests."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=lambda: {"memory": "1Gi"}, description="Limits."
    )


class RouterSpec(Model):
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
            f"How long the router offers a conversation's blocks; must stay more than "
            f"{DECLINE_WINDOW} below kvTransfer.decoderBlocksTTL (P declines reads within "
            f"{DECLINE_WINDOW} of D's deadline). Default: decoderBlocksTTL minus "
            f"{DECLINE_WINDOW} minus a margin of {_MARGIN}."
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
    migrate_streams: bool = Field(
        True,
        description="Carry a stream whose engine dies after the first byte over to another "
        "engine (another decoder, else a prefill engine), which goes on from the prompt and "
        "the tokens already streamed, so the client sees one answer. Chat and completions "
        "streams without tools, log probabilities, response formats or penalties; others end "
        "with an error event, as with false.",
    )
    termination_grace_period_seconds: int = Field(
        120,
        ge=15,
        le=3600,
        description="Time a router pod gets to stop: a preStop delay of "
        "5s while its Service stops sending to it, then the turns in flight finish (up to this "
        "less 10s; a turn still streaming then is cut), then it exits. Set it above your "
        "longest answer's streaming time.",
    )
    isolate_tenant_caches: bool = Field(
        True,
        description="Give each tenant's requests their own vLLM cache_salt, so no cached-token "
        "count or timing tells a tenant what another sent. False: tenants share cached "
        "prefixes (a common system prompt is computed once for all).",
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
