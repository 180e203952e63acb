"""The router's configuration: one pydantic model, loaded from YAML, then env, then CLI flags.

Why one model: the operator renders this YAML into a ConfigMap with
`RouterConfig(...).model_dump(mode="json", exclude_none=True)`, the CLI and the tests build it
in-process, and validation (for example the handle TTL staying below the decoder's block TTL)
happens in exactly one place. Field names are snake_case and stable: they are an API.

Precedence: defaults < YAML file < environment (`BOOMERANG_*`) < command-line flags.
Secrets never need to be in the file: `BOOMERANG_REDIS_URL` and `BOOMERANG_API_KEYS_FILE`
override the store URL and the API keys file (the operator passes them from a Secret).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from boomerang import facts
from boomerang.facts import P_DECLINE_WINDOW_S, default_handle_ttl
from boomerang.facts.engine import KV_EVENTS_PORT_OFFSET, KV_REPLAY_PORT_OFFSET

DEFAULT_SESSION_HEADERS = (
    "x-claude-code-session-id",
    "session_id",
    "session-id",
    "x-session-affinity",
    "x-session-id",
)
"""Headers agents send on every turn of one session (Claude Code, Codex, opencode, and vLLM's
benchmark clients), in the order they are tried (`sessions.py`)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KubernetesSource(_Model):
    """Discover engine pods from the EndpointSlices of a headless Service."""

    namespace: str = Field(description="Namespace of the Service.")
    service: str = Field(
        description="Service name; slices labelled kubernetes.io/service-name=<service> "
        "are watched."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Engine HTTP port on each pod.")


class EndpointSource(_Model):
    """Where one role's engines are: exactly one of a static URL list or Kubernetes discovery."""

    urls: list[str] | None = Field(
        default=None, description='Static engine base URLs, e.g. "http://10.0.0.5:8000".'
    )
    kubernetes: KubernetesSource | None = Field(
        default=None,
        description="Watch ready endpoints of a headless Service; each endpoint is one pod IP.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EndpointSource:
        if (self.urls is None) == (self.kubernetes is None):
            raise ValueError("set exactly one of `urls` or `kubernetes`")
        if self.urls is not None:
            if not self.urls:
                raise ValueError("`urls` must name at least one engine")
            self.urls = [u.rstrip("/") for u in self.urls]
            for url in self.urls:
                if not url.startswith(("http://", "https://")):
                    raise ValueError(f"engine URL must start with http:// or https://: {url!r}")
        return self


class StoreConfig(_Model):
    """Where conversation handles live."""

    kind: Literal["memory", "redis"] = Field(
        default="memory",
        description="memory: one router replica; redis: shared by several replicas.",
    )
    url: str | None = Field(
        default=None,
        description="Redis URL (redis://host:6379/0); env BOOMERANG_REDIS_URL overrides it.",
    )
    max_conversations: int = Field(
        default=200_000,
        ge=1,
        description="Cap on stored conversations (memory store evicts the oldest beyond it).",
    )
    key_prefix: str = Field(
        default="boomerang:router:", description="Prefix of every Redis key the router writes."
    )
    sweep_interval_s: float = Field(
        default=10.0, gt=0, description="How often the memory store drops expired handles."
    )

    @model_validator(mode="after")
    def _redis_has_url(self) -> StoreConfig:
        if self.kind == "redis" and not self.url:
            raise ValueError("store.kind=redis needs store.url (or env BOOMERANG_REDIS_URL)")
        return self


class Timeouts(_Model):
    """Every upstream call is bounded; values in seconds."""

    connect_s: float = Field(default=3.0, gt=0, description="TCP connect to an engine.")
    prefill_s: float = Field(default=120.0, gt=0, description="Whole prefill request.")
    decode_first_byte_s: float = Field(
        default=120.0, gt=0, description="From sending to D until its response headers arrive."
    )
    decode_total_s: float = Field(default=900.0, gt=0, description="Whole decode request.")
    tokenize_s: float = Field(default=10.0, gt=0, description="Tokenize call used to verify reuse.")
    probe_s: float = Field(default=3.0, gt=0, description="One health probe.")


class HealthConfig(_Model):
    """Passive ejection and active probing of engines."""

    probe_interval_s: float = Field(default=5.0, gt=0, description="Active /health probe period.")
    eject_after_failures: int = Field(
        default=3, ge=1, description="Consecutive failures that eject an engine from selection."
    )
    readmit_after_successes: int = Field(
        default=1, ge=1, description="Successful probes that bring an ejected engine back."
    )
    idle_probe: bool = Field(
        default=True,
        description="Time an idle decoder's time per output token once per engine start (two "
        "short answers on a decoder with nothing of the router's in flight; `idle_probe.py`): "
        "the SLO-aware choice derives its TPOT bound from it.",
    )


class Tuning(_Model):
    """How each turn's path is chosen and how long D's blocks are retained (issue 12).

    The one section the router re-reads while running (`tuning.py`): a mounted ConfigMap is
    updated in place, so a change takes effect within `tuning_poll_s`, with no restart.
    """

    mode: facts.Mode = Field(
        default=facts.DEFAULT_MODE,
        description="adaptive: each turn takes its cheapest path (pull, recompute or continue "
        "on the decoder that holds the history) by a cost model learned online, and D keeps a "
        "conversation's blocks for a learned share of the gaps between turns; static: pull "
        "what P's own cache lacks when it reaches the engine's threshold, D's TTL.",
    )
    break_even_min_tokens: int = Field(
        default=0,
        ge=0,
        description="Lower bound on the learned pull/recompute break-even (history tokens); "
        "recompute_threshold is always a floor on top.",
    )
    break_even_max_tokens: int = Field(
        default=1_000_000, ge=0, description="Upper bound on the learned break-even."
    )
    continue_on_decode: bool = Field(
        default=True,
        description="Allow the continue path: the turn goes straight to the decoder that holds "
        "the history, which serves it from its prefix cache and computes the suffix.",
    )
    continue_max_suffix_tokens: int = Field(
        default=8192,
        ge=0,
        description="Hard bound on the suffix a continued turn computes on D (below it, the "
        "SLO's stall budget or the ITL budget decides).",
    )
    itl_budget_s: float | None = Field(
        default=None,
        ge=0,
        description="Continue only while D's estimated cost of computing the suffix (the "
        "inter-token latency its other streams see) stays within this budget. Unset: derived "
        "per decoder, continue_tpot_tolerance of how long its streams decode (router-measured), "
        "50 ms until one is measured.",
    )
    continue_tpot_tolerance: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="With itl_budget_s unset: the share of a co-running stream's time per output "
        "token that one continued prefill may add (the budget is this times D's stream time).",
    )
    slo_aware: bool = Field(
        default=True,
        description="Choose paths for the turns' TTFT and TPOT bounds (adaptive): a turn "
        "continues on D while D's streams have TPOT slack left (a budget per stream, summed "
        "over every turn that joins them), and a first turn runs on a decoder alone when P "
        "would make it miss its TTFT bound. Off, or with itl_budget_s set: each continue is "
        "bounded alone by the ITL budget.",
    )
    slo_scale: float = Field(
        default=5.0,
        ge=1,
        description="The bounds not set below are this many times what the router measured "
        "of an idle engine: a recompute of the turn's whole prompt (TTFT), a decoder's time "
        "per output token (TPOT).",
    )
    ttft_slo_s: float | None = Field(
        default=None, gt=0, description="Every turn's TTFT bound, seconds (unset: derived)."
    )
    tpot_slo_s: float | None = Field(
        default=None, gt=0, description="Every stream's TPOT bound, seconds (unset: derived)."
    )
    retention_quantile: float = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="Keep a handle for this quantile of the learned gap between turns.",
    )
    retention_min_s: float = Field(
        default=10.0, ge=0, description="Never release a handle earlier; ceiling = handle TTL."
    )
    decode_memory_budget: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Fraction of D's KV blocks that retained handles may hold.",
    )
    reuse_released: bool = Field(
        default=True,
        description="After releasing a handle's lease, keep it (until its TTL) for the "
        "continue path only: D's prefix cache still holds the freed blocks until it needs "
        "the room, so a conversation that comes back late can still be served from them.",
    )
    retention_max_client_s: float | None = Field(
        default=None,
        gt=0,
        description="The longest retention a client's hint may ask for (Anthropic "
        "`cache_control.ttl`, OpenAI `prompt_cache_retention`); longer hints are capped and "
        "logged. Default: the decoder TTL. The handle TTL still bounds every lease.",
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> Tuning:
        if self.break_even_min_tokens > self.break_even_max_tokens:
            raise ValueError(
                f"break_even_min_tokens ({self.break_even_min_tokens}) must not exceed "
                f"break_even_max_tokens ({self.break_even_max_tokens})"
            )
        return self


class KvEventsConfig(_Model):
    """The engines' KV cache events, and the index the router keeps from them (`kvevents.py`)."""

    enabled: bool = Field(
        default=True,
        description="Subscribe to every engine's KV events and route by what each one holds.",
    )
    port_offset: int = Field(
        default=KV_EVENTS_PORT_OFFSET,
        description="An engine publishes on its HTTP port plus this.",
    )
    replay_port_offset: int = Field(
        default=KV_REPLAY_PORT_OFFSET,
        description="An engine answers replay requests on its HTTP port plus this.",
    )
    hash_seed: str | None = Field(
        default=None,
        description="The engines' PYTHONHASHSEED, when set (their block hashes start from it).",
    )


class RouterConfig(_Model):
    """Everything the router needs; see the module docstring for precedence."""

    listen_host: str = Field(default="0.0.0.0", description="Address to listen on.")
    listen_port: int = Field(default=8080, ge=0, le=65535, description="Port to listen on.")
    model: str | None = Field(
        default=None,
        description="Served model name; when set, requests for another model get 404.",
    )
    prefill: EndpointSource = Field(description="The prefill engines.")
    decode: EndpointSource = Field(description="The decode engines.")
    bidirectional: bool = Field(
        default=True,
        description="Attach D's retained KV params to P; only true when P runs bidirectional.",
    )
    prefill_prefix_caching: bool = Field(
        default=True,
        description="Whether the prefill engines run vLLM's prefix cache: when off, a P holds "
        "nothing of a conversation after its turn, so P's cache never stands in for D's blocks.",
    )
    decoder_blocks_ttl_s: float = Field(
        default=float(facts.DECODER_BLOCKS_TTL_S),
        gt=0,
        description="D's decoder_kv_blocks_ttl (how long D pins blocks).",
    )
    recompute_threshold: int = Field(
        default=facts.RECOMPUTE_THRESHOLD_TOKENS,
        ge=0,
        description="P's kv_recompute_threshold: a partial reuse (the whole blocks of D that "
        "the new prompt shares) of fewer tokens than this is not offered; P computes instead.",
    )
    partial_reuse: bool = Field(
        default=True,
        description="When the new prompt diverges from D's tokens, attach D's handle narrowed to "
        "the whole blocks of the common prefix; false: full hits only (all or nothing).",
    )
    handle_ttl_s: float | None = Field(
        default=None,
        description="How long the router offers a handle; default derived below the decoder TTL.",
    )
    store: StoreConfig = Field(default_factory=StoreConfig, description="Conversation store.")
    api_keys_file: str | None = Field(
        default=None,
        description="One API key per line, optionally `key tenant`; set = Bearer auth required. "
        "Re-read when it changes (a Secret update); an unreadable or empty update is ignored.",
    )
    api_keys_poll_s: float = Field(
        default=2.0,
        gt=0,
        description="How often the API keys file is checked for a change (inode, size, mtime).",
    )
    tenant_header: str | None = Field(
        default=None,
        description="Without API keys: take the tenant from this request header (only behind a "
        "gateway that sets it and strips it from clients).",
    )
    migrate_streams: bool = Field(
        default=True,
        description="Carry a stream whose engine dies after the first byte over to another "
        "engine (the prompt and the tokens streamed, as ids; `migration.py`), so the client "
        "sees one answer; false: end it with an error event.",
    )
    shutdown_drain_s: float = Field(
        default=60.0,
        gt=0,
        description="After SIGTERM: how long the turns in flight may finish. New connections "
        "are refused at once (a pod's preStop delay lets its Service stop sending first); "
        "a turn still running at the end is cut.",
    )
    tenant_cache_salt: bool = Field(
        default=True,
        description="Give each tenant's requests their own vLLM `cache_salt` (`cache_salt.py`), "
        "so no cached-token count or timing reveals another tenant's prompt prefix; false: "
        "tenants share cached prefixes.",
    )
    engine_api_key: str | None = Field(
        default=None,
        description="Bearer key for engines started with --api-key; prefer env "
        "BOOMERANG_ENGINE_API_KEY.",
    )
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Upstream timeouts.")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Engine health.")
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest accepted request body."
    )
    max_inflight: int = Field(
        default=1024,
        ge=0,
        description="Completion requests one replica serves at once; beyond it 429 with "
        "Retry-After (no engine called). 0: unlimited. Health, metrics and models are exempt.",
    )
    overload_retry_after_s: int = Field(
        default=1, ge=1, description="The Retry-After (seconds) of a 429 at the in-flight limit."
    )
    prefill_retries: int = Field(
        default=2, ge=0, description="Extra prefill attempts on other engines after a failure."
    )
    decode_retries: int = Field(
        default=2, ge=0, description="Extra decode attempts before the first byte reached a client."
    )
    decode_affinity_slack: int = Field(
        default=4,
        ge=0,
        description="Keep a conversation on its D unless it has this many more in-flight requests "
        "than the least loaded D.",
    )
    single_engine_fallback: bool = Field(
        default=True,
        description="When one role has no engine for a turn (none listed, all ejected, or "
        "every one tried failed), serve it as a plain request on one engine of the other role, "
        "without KV reuse (a one-replica role's pod restarting); false: fail the turn (503, or "
        "502/504 after failures).",
    )
    affinity: bool = Field(
        default=True,
        description="Send a conversation's turn to the prefill and decode engines that served "
        "its previous turn (their prefix caches hold its history) unless that costs more than "
        "moving: P by outstanding work plus what it must compute, D within "
        "decode_affinity_slack.",
    )
    kv_events: KvEventsConfig = Field(
        default_factory=KvEventsConfig, description="The engines' KV events and the index."
    )
    decode_first_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Decode-first routing (`decode_first.py`), the policy peers ship without "
        "bidirectional KV: the decoder caching the longest prefix of the prompt (within "
        "decode_affinity_slack of the least loaded) serves the turn alone when fewer than this "
        "many prompt tokens are not in its cache; otherwise P prefills and it decodes. Needs "
        "bidirectional false and the KV events; unset: off.",
    )
    decode_first_ratio: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="With decode_first_tokens: the decoder serves the turn alone only when what "
        "it lacks is also under this share of the prompt (Dynamo's IslBounding uses 2048 "
        "tokens and 0.7). Unset: the token threshold alone (llm-d's rule).",
    )
    decode_first_p_busy_tokens: int | None = Field(
        default=None,
        ge=1,
        description="With decode_first_tokens: the decoder also serves the turn alone whenever "
        "the prefill engine the turn would use has at least this many prompt tokens queued "
        "(Dynamo's IslOrLoad: skip P while it is busy). Unset: P's load is not looked at.",
    )
    affinity_ttl_s: float = Field(
        default=900.0,
        gt=0,
        description="How long the router remembers where a conversation's last turn ran.",
    )
    fingerprint_conversations: bool = Field(
        default=True,
        description="Find a conversation by its content when the client sends no conversation_id.",
    )
    session_headers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SESSION_HEADERS),
        description="Request headers that name an agent's session (first present wins, after "
        "conversation_id and X-Conversation-Id, before the body's prompt_cache_key): the "
        "session names the conversation in the caller's tenant. Empty: headers name nothing.",
    )
    decode_stream_params: Literal["auto", "yes", "no"] = Field(
        default="auto",
        description="Whether D's streamed final chunk carries kv_transfer_params: auto detects "
        "per engine (version >= 0.33 or observed), yes/no force it.",
    )
    stream_without_params: Literal["buffer", "stream"] = Field(
        default="buffer",
        description="For a streaming client when D cannot stream its params: buffer = call D "
        "non-streaming and re-emit SSE (keeps reuse), stream = stream and lose reuse.",
    )
    log_level: str = Field(default="INFO", description="Python log level.")
    log_json: bool = Field(default=True, description="One JSON object per log line.")
    tuning: Tuning = Field(
        default_factory=Tuning,
        description="Path choice and retention (`Tuning`); re-read from the file while running.",
    )
    tuning_poll_s: float = Field(
        default=2.0,
        gt=0,
        description="How often the config file is checked for a new `tuning` section.",
    )
    lease_token_file: Path | None = Field(
        default=None,
        description="File holding the bearer token of the decode engines' lease API (release "
        "and renew D's blocks); env BOOMERANG_LEASE_TOKEN gives the token itself instead.",
    )
    _source: Path | None = PrivateAttr(default=None)
    """The YAML file this config was loaded from (`tuning.py` re-reads its `tuning`)."""

    @model_validator(mode="after")
    def _decode_first_without_handles(self) -> RouterConfig:
        variants = self.decode_first_ratio, self.decode_first_p_busy_tokens
        if self.decode_first_tokens is None and any(v is not None for v in variants):
            raise ValueError(
                "decode_first_ratio and decode_first_p_busy_tokens refine decode-first "
                "routing: set decode_first_tokens too"
            )
        if self.decode_first_tokens is not None and self.bidirectional:
            raise ValueError(
                "decode_first_tokens is a policy without D's handles: set bidirectional false "
                "(Boomerang's adaptive tuning continues on D by cost instead)"
            )
        return self

    @model_validator(mode="after")
    def _ttl_below_decoder(self) -> RouterConfig:
        limit = self.decoder_blocks_ttl_s - P_DECLINE_WINDOW_S
        if self.handle_ttl_s is not None:
            if not 0 < self.handle_ttl_s < limit:
                raise ValueError(
                    f"handle_ttl_s must be > 0 and strictly below decoder_blocks_ttl_s - "
                    f"{P_DECLINE_WINDOW_S:g} s = {limit:g} s, got {self.handle_ttl_s:g}"
                )
        elif default_handle_ttl(self.decoder_blocks_ttl_s) <= 0:
            raise ValueError(f"decoder_blocks_ttl_s={self.decoder_blocks_ttl_s:g} is too short")
        return self

    @property
    def effective_handle_ttl_s(self) -> float:
        """The TTL the router really uses for handles."""
        if self.handle_ttl_s is not None:
            return self.handle_ttl_s
        return default_handle_ttl(self.decoder_blocks_ttl_s)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> RouterConfig:
        """Defaults < YAML at `path` < `env` < `overrides` (already-parsed CLI values)."""
        data: dict[str, Any] = {}
        if path is not None:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{path}: the top level must be a mapping")
            data = loaded
        data = _merge(data, env_overrides(env or {}))
        data = _merge(data, dict(overrides or {}))
        config = cls.model_validate(data)
        config._source = Path(path) if path is not None else None
        return config

    @property
    def source_path(self) -> Path | None:
        """The YAML file it was loaded from (None: built in-process, nothing to re-read)."""
        return self._source


_ENV_SCALARS: dict[str, tuple[str, ...]] = {
    "BOOMERANG_ROUTER_LISTEN_HOST": ("listen_host",),
    "BOOMERANG_ROUTER_LISTEN_PORT": ("listen_port",),
    "BOOMERANG_ROUTER_MODEL": ("model",),
    "BOOMERANG_ROUTER_BIDIRECTIONAL": ("bidirectional",),
    "BOOMERANG_ROUTER_DECODER_BLOCKS_TTL_S": ("decoder_blocks_ttl_s",),
    "BOOMERANG_ROUTER_HANDLE_TTL_S": ("handle_ttl_s",),
    "BOOMERANG_ROUTER_RECOMPUTE_THRESHOLD": ("recompute_threshold",),
    "BOOMERANG_ROUTER_PARTIAL_REUSE": ("partial_reuse",),
    "BOOMERANG_ROUTER_DECODE_FIRST_TOKENS": ("decode_first_tokens",),
    "BOOMERANG_ROUTER_TUNING_MODE": ("tuning", "mode"),
    "BOOMERANG_ROUTER_SINGLE_ENGINE_FALLBACK": ("single_engine_fallback",),
    "BOOMERANG_ROUTER_LOG_LEVEL": ("log_level",),
    "BOOMERANG_REDIS_URL": ("store", "url"),
    "BOOMERANG_API_KEYS_FILE": ("api_keys_file",),
    "BOOMERANG_ROUTER_API_KEYS_POLL_S": ("api_keys_poll_s",),
    "BOOMERANG_ROUTER_MAX_INFLIGHT": ("max_inflight",),
    "BOOMERANG_ROUTER_OVERLOAD_RETRY_AFTER_S": ("overload_retry_after_s",),
    "BOOMERANG_ENGINE_API_KEY": ("engine_api_key",),
}
_ENV_LISTS: dict[str, tuple[str, ...]] = {
    "BOOMERANG_ROUTER_PREFILL_URLS": ("prefill",),
    "BOOMERANG_ROUTER_DECODE_URLS": ("decode",),
}


def env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """The config fragment that `BOOMERANG_*` variables set (pure: env is passed in)."""
    out: dict[str, Any] = {}
    for name, path in _ENV_SCALARS.items():
        if env.get(name):
            _set(out, path, env[name])
    for name, path in _ENV_LISTS.items():
        if env.get(name):
            urls = [u.strip() for u in env[name].split(",") if u.strip()]
            _set(out, path, {"urls": urls})
    return out


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `top` over `base`; an endpoint source given on top replaces the base's."""
    out = dict(base)
    for key, value in top.items():
        replace = key in ("prefill", "decode")
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) and not replace:
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out
