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
- on AWS EFA, NIXL must use LIBFABRIC with `FI_PROVIDER=efa` (UCX silently emulates over TCP).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["prefill", "decode"]
Backend = Literal["UCX", "LIBFABRIC"]
LoadFailurePolicy = Literal["recompute", "fail"]

ROLES: tuple[Role, ...] = ("prefill", "decode")
HTTP_PORT = 8000
"""The engine's OpenAI HTTP port."""
SIDE_CHANNEL_PORTS: Mapping[Role, int] = {"prefill": 5600, "decode": 5700}
"""NIXL's ZMQ side-channel port per role: distinct, so P and D can share a host (local runtime)."""
KV_ROLES: Mapping[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
P_DECLINE_WINDOW_S = 5.0
"""vLLM's prefill declines a D->P read within this many seconds of D's block deadline."""


def default_handle_ttl(decoder_ttl_s: float) -> float:
    """How long a router may offer D's blocks: the decoder TTL minus P's decline window minus a
    margin (10 %, at least 5 s).

    The margin covers the time between D finishing (when its TTL starts) and the router storing
    the handle, plus clock drift between router replicas sharing Redis. The operator's status
    and the router's own default both read it from here.
    """
    return decoder_ttl_s - P_DECLINE_WINDOW_S - max(5.0, 0.1 * decoder_ttl_s)


ENGINE_REVISION_ENV = "BOOMERANG_ENGINE_REVISION"
"""Set by the operator and the local runtime to what P and D must agree on to handshake (the
engine build and the connector protocol); the plugin publishes it on the engine's `/metrics`."""
ENGINE_REVISION_METRIC = "boomerang_engine_revision_info"
"""The gauge (value 1) whose `revision` label carries it, so the router pairs P and D of one
revision while a rollout runs both."""

ENGINE_CAPABILITY_METRIC = "boomerang_engine_capability_info"
"""A gauge per engine-side change of Boomerang's plugin that the router relies on, named by its
`capability` label: `continue` (D frees the blocks of requests it served alone,
`own_requests`). 1 when in force; 0 when not (the plugin refused this vLLM, or the patch did not
apply). Absent or 0, the router does not take the path that needs it."""
CONTINUE_CAPABILITY = "continue"
CAPABILITIES = (CONTINUE_CAPABILITY,)
"""Every capability the plugin publishes, in force or not."""

STREAMS_PARAMS_SINCE = (0, 33)
"""The first vLLM (major, minor) that puts D's `kv_transfer_params` on the final streamed chunk
itself; before it, Boomerang's plugin adds them (and the router knows to expect them)."""

LEASE_TOKEN_ENV = "BOOMERANG_LEASE_TOKEN"
"""The bearer token of the engine's lease API (`boomerang.connector.leases`); unset = the API
answers 403 (no control), and the router falls back to D's TTL."""
LEASE_PATH = "/boomerang/v1/leases"
"""Where the lease API lives on the engine's HTTP port: GET it, POST `/release` and `/renew`."""
LEASE_MIDDLEWARE = "boomerang.connector.leases.LeaseControl"
"""The ASGI middleware serving the lease API in vLLM's API server (`--middleware`)."""
LEASE_WORKER_EXTENSION = "boomerang.connector.leases.LeaseWorker"
"""The methods mixed into vLLM's worker that release or renew D's retained blocks
(`--worker-extension-cls`)."""


@dataclass(frozen=True)
class KVTransferSettings:
    """The kv-transfer knobs of one deployment; defaults are vLLM's own, except the policy."""

    bidirectional: bool = True
    recompute_threshold: int = 64
    decoder_blocks_ttl_s: int = 480
    lease_duration_s: int = 30
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
    enforce_eager: bool = False
    port: int = HTTP_PORT
    host: str = "0.0.0.0"
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
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    if engine.enforce_eager:
        args.append("--enforce-eager")
    return args + list(engine.extra_args)


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
    return env
