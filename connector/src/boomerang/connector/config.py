"""The one description of how a vLLM engine is configured for P/D with bidirectional KV reuse.

The operator renders pod arguments from these functions, the local runtime starts processes
from them, and the tests drive engines through them: no two places can disagree about the
engine's configuration. Everything here is pure (no I/O, no environment reads).

Facts encoded here (vLLM 0.21+ NixlConnector):
- `bidirectional_kv_xfer` must be on for both roles, otherwise P stalls on D's params;
- the threshold and lease are read by P, the blocks TTL by D; unknown keys are ignored, so both
  roles get the same extra config and only `kv_role` differs;
- `kv_load_failure_policy: recompute` turns a failed or expired D->P read into a local
  recompute instead of an HTTP 500 to the user;
- on AWS EFA, NIXL must use LIBFABRIC with `FI_PROVIDER=efa` (UCX silently emulates over TCP),
  and libfabric's shared-memory path stays off (`FI_EFA_ENABLE_SHM_TRANSFER=0`: it needs
  cross-memory attach, which the pods' RuntimeDefault seccomp profile may refuse; NIXL's
  transfers go over the NIC);
- P and D must render a prompt identically (D decodes on P's KV of P's rendering, and the
  router verifies reuse on P's): the chat template and the tool-call and reasoning parsers
  (which adjust requests) are the engine's, one setting for both roles;
- `--enable-scale-out` turns on vLLM's render endpoints (`/v1/responses/render`,
  `/v1/messages/render`), which the router asks for a Responses or Messages prompt's token ids
  (the rendering those endpoints run, exactly).
- `--enable-prompt-tokens-details` makes vLLM report, per request, the prompt tokens it did not
  compute (its prefix-cache hit plus what its KV connector loaded), which the router passes to
  clients as their cached tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from boomerang import facts
from boomerang.facts.engine import (
    HTTP_PORT,
    KV_EVENTS_PORT_OFFSET,
    KV_EVENTS_TOPIC,
    KV_REPLAY_PORT_OFFSET,
    ROLES,
    SIDE_CHANNEL_PORTS,
    Role,
)

Backend = Literal["UCX", "LIBFABRIC"]
LoadFailurePolicy = Literal["recompute", "fail"]

KV_ROLES: Mapping[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


def kv_events_config(http_port: int) -> dict[str, object]:
    """The `--kv-events-config` object of an engine listening on `http_port`."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{http_port + KV_EVENTS_PORT_OFFSET}",
        "replay_endpoint": f"tcp://*:{http_port + KV_REPLAY_PORT_OFFSET}",
        "topic": KV_EVENTS_TOPIC,
    }


LEASE_MIDDLEWARE = "boomerang.connector.plugin.lease_api.LeaseControl"
"""The ASGI middleware serving the lease API in vLLM's API server (`--middleware`)."""
LEASE_WORKER_EXTENSION = "boomerang.connector.plugin.leases.LeaseWorker"
"""The methods mixed into vLLM's worker that release or renew D's retained blocks
(`--worker-extension-cls`)."""


BUILTIN_MODELS: tuple[str, ...] = ("small", "tiny")
"""The deterministic test models `boomerang.connector.launch.model` builds (its `SPECS`, tested
equal)."""

_NAME = "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_DNS_SUBDOMAIN = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_PATH = "(/[^ ]*)?"
MODEL_SOURCES: Mapping[str, tuple[str, str]] = {
    "hf": ("hf://org/name", f"hf://{_NAME}/{_NAME}"),
    "s3": ("s3://bucket/path", f"s3://[A-Za-z0-9][-A-Za-z0-9_.]{{1,253}}[A-Za-z0-9]{_PATH}"),
    "pvc": ("pvc://claim/path", f"pvc://{_DNS_SUBDOMAIN}{_PATH}"),
    "builtin": (
        " or ".join(f"builtin://{name}" for name in BUILTIN_MODELS),
        f"builtin://({'|'.join(BUILTIN_MODELS)})",
    ),
}
"""Every shape of `spec.model.source`, by scheme: how a user reads it, and the regular
expression of the sources that can load (a Hugging Face id `org/name`, an S3 bucket and key,
a PersistentVolumeClaim and a path in it, a builtin model; no spaces). The API refuses other
sources at admission and the engine entrypoint refuses them at start, both from this table.
Written without backslashes, so that a CEL string literal carries the expression unchanged."""
MODEL_SOURCE_RE = "^(" + "|".join(regex for _, regex in MODEL_SOURCES.values()) + ")$"
MODEL_SOURCE_SHAPES = ", ".join(shape for shape, _ in MODEL_SOURCES.values())
"""The allowed shapes, for messages: `hf://org/name, s3://bucket/path, ...`."""


def model_source_error(source: str) -> str | None:
    """Why `source` is not a model source Boomerang can load, or None when it is one."""
    if re.fullmatch(MODEL_SOURCE_RE, source):
        return None
    return f"model source {source!r} is none of {MODEL_SOURCE_SHAPES} (without spaces)"


@dataclass(frozen=True)
class KVTransferSettings:
    """The kv-transfer knobs of one deployment; defaults are vLLM's own, except the policy."""

    bidirectional: bool = True
    recompute_threshold: int = facts.RECOMPUTE_THRESHOLD_TOKENS
    decoder_blocks_ttl_s: int = facts.DECODER_BLOCKS_TTL_S
    lease_duration_s: int = facts.LEASE_DURATION_S
    backend: Backend = "UCX"
    load_failure_policy: LoadFailurePolicy = "recompute"
    buffer_device: Literal["cuda", "cpu"] = "cuda"


@dataclass(frozen=True)
class EngineSettings:
    """What one engine serves and how; the role's replicas and placement live elsewhere."""

    model: str
    served_model_name: str
    max_model_len: int | None = None
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    prefix_caching: bool = True
    kv_events: bool = True
    """Publish KV cache events (stored and evicted blocks) for the router's index."""
    enforce_eager: bool = False
    port: int = HTTP_PORT
    host: str = "0.0.0.0"
    tool_call_parser: str | None = None
    """vLLM's tool-call parser (`hermes`, ...): turns on automatic tool choice."""
    reasoning_parser: str | None = None
    """vLLM's reasoning parser (`qwen3`, ...)."""
    chat_template: str | None = None
    """The chat template file as the engine sees it; `model://<path>` names a file in the
    model, resolved by the engine's entrypoint. None: the model's own."""
    extra_args: Sequence[str] = field(default_factory=tuple)


def kv_transfer_config(role: Role, kv: KVTransferSettings) -> dict[str, object]:
    """The `--kv-transfer-config` object for one role."""
    if role not in KV_ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    extra: dict[str, object] = {
        "backends": [kv.backend],
        "bidirectional_kv_xfer": kv.bidirectional,
        "kv_recompute_threshold": kv.recompute_threshold,
        "decoder_kv_blocks_ttl": kv.decoder_blocks_ttl_s,
        "kv_lease_duration": kv.lease_duration_s,
    }
    return {
        "kv_connector": "NixlConnector",
        "kv_role": KV_ROLES[role],
        "kv_buffer_device": kv.buffer_device,
        "kv_load_failure_policy": kv.load_failure_policy,
        "kv_connector_extra_config": extra,
    }


def engine_args(role: Role, engine: EngineSettings, kv: KVTransferSettings) -> list[str]:
    """Arguments for vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`)."""
    args = [
        "--model",
        engine.model,
        "--served-model-name",
        engine.served_model_name,
        "--host",
        engine.host,
        "--port",
        str(engine.port),
        "--dtype",
        engine.dtype,
        "--tensor-parallel-size",
        str(engine.tensor_parallel_size),
        "--enable-prefix-caching" if engine.prefix_caching else "--no-enable-prefix-caching",
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(role, kv), sort_keys=True, separators=(",", ":")),
        # Both roles, like the kv config: one description of the engine (P holds no leases).
        "--middleware",
        LEASE_MIDDLEWARE,
        "--worker-extension-cls",
        LEASE_WORKER_EXTENSION,
    ]
    if engine.kv_events and engine.prefix_caching:
        events = kv_events_config(engine.port)
        args += ["--kv-events-config", json.dumps(events, sort_keys=True, separators=(",", ":"))]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    if engine.enforce_eager:
        args.append("--enforce-eager")
    return args + prompt_args(engine) + list(engine.extra_args)


def prompt_args(engine: EngineSettings) -> list[str]:
    """How the engine renders and parses: its chat template, tool-call and reasoning parsers,
    and the render endpoints the router verifies Responses and Messages prompts with."""
    args = ["--enable-scale-out", "--enable-prompt-tokens-details"]
    if engine.chat_template is not None:
        args += ["--chat-template", engine.chat_template]
    if engine.tool_call_parser is not None:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", engine.tool_call_parser]
    if engine.reasoning_parser is not None:
        args += ["--reasoning-parser", engine.reasoning_parser]
    return args


def engine_env(role: Role, kv: KVTransferSettings, *, efa: bool = False) -> dict[str, str]:
    """Environment for one engine, besides the side-channel host (the pod IP, set at run time)."""
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(SIDE_CHANNEL_PORTS[role]),
        "BOOMERANG_ROLE": role,
    }
    if kv.backend == "LIBFABRIC" or efa:
        env["FI_PROVIDER"] = "efa" if efa else "tcp"
        if efa:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
            env["FI_EFA_FORK_SAFE"] = "1"
            env["FI_EFA_ENABLE_SHM_TRANSFER"] = "0"
    return env


EFA_REGISTRATION_FAILED = "EFAMemoryRegistrationFailed"
"""The reason an engine gives, in its termination message, when NIXL could not register memory
with the EFA NIC; the operator's status carries it as Degraded's reason."""
EFA_REGISTRATION_LOG = re.compile(r"fi_mr_reg\w* failed")
"""NIXL's LIBFABRIC backend logs `fi_mr_reg failed on rail N: <libfabric's error>` when
registering memory (the KV cache in GPU memory) fails; older releases named fi_mr_regattr."""
EFA_REGISTRATION_FIX = (
    "set spec.efa.privileged: true (registering GPU memory with the EFA NIC may need a "
    "privileged container, e.g. for /dev/gdrdrv; docs/eks.md, Privileged EFA pods)"
)
