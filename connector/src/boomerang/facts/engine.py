"""The names an engine answers to that the operator, the router and the simulator also use: its
roles and ports, where its KV events and lease API are, the gauges Boomerang's plugin publishes
and the environment it reads. Defined once here; `boomerang.connector.config` builds an engine's
configuration from them, the router finds and reads engines by them.

Pure constants: no I/O, nothing imported from Boomerang's parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Role = Literal["prefill", "decode"]

ROLES: tuple[Role, ...] = ("prefill", "decode")
HTTP_PORT = 8000
"""The engine's OpenAI HTTP port."""
SIDE_CHANNEL_PORTS: Mapping[Role, int] = {"prefill": 5600, "decode": 5700}
"""NIXL's ZMQ side-channel port per role: distinct, so P and D can share a host (local runtime)."""

KV_EVENTS_PORT_OFFSET = 1000
"""An engine publishes its KV cache events (vLLM's ZMQ publisher) on its HTTP port plus this,
and answers replay requests on its HTTP port plus `KV_REPLAY_PORT_OFFSET`: the router finds
both from the engine's URL, whether every pod listens on 8000 (9000 and 10000) or the local
runtime's replicas on consecutive ports."""
KV_REPLAY_PORT_OFFSET = 2000
KV_EVENTS_TOPIC = "kv"

ENGINE_REVISION_ENV = "BOOMERANG_ENGINE_REVISION"
"""Set by the operator and the local runtime to what P and D must agree on to handshake (the
engine build and the connector protocol); the plugin publishes it on the engine's `/metrics`."""
ENGINE_REVISION_METRIC = "boomerang_engine_revision_info"
"""The gauge (value 1) whose `revision` label carries it, so the router pairs P and D of one
revision while a rollout runs both."""

ENGINE_CAPABILITY_METRIC = "boomerang_engine_capability_info"
"""A gauge per engine-side change of Boomerang's plugin that the router relies on, named by its
`capability` label: `continue` (D frees the blocks of requests it served alone,
`own_requests`), `pressure` (D's retained leases yield to live work when it runs out of KV
blocks, `pressure`). 1 when in force; 0 when not (the plugin refused this vLLM, or the patch did
not apply). Absent or 0, the router does not take the path that needs it."""
CONTINUE_CAPABILITY = "continue"
PRESSURE_CAPABILITY = "pressure"
"""D may release a retained lease on its own: a router must claim a lease (the lease API's
`/claim`) and have D confirm it before offering the handle to P."""
CAPABILITIES = (CONTINUE_CAPABILITY, PRESSURE_CAPABILITY)
"""Every capability the plugin publishes, in force or not."""

STREAMS_PARAMS_SINCE = (0, 33)
"""The first vLLM (major, minor) that puts D's `kv_transfer_params` on the final streamed chunk
itself; before it, Boomerang's plugin adds them (and the router knows to expect them)."""

LEASE_TOKEN_ENV = "BOOMERANG_LEASE_TOKEN"
"""The bearer token of the engine's lease API (`boomerang.connector.plugin.leases`); unset = the API
answers 403 (no control), and the router falls back to D's TTL."""
LEASE_PATH = "/boomerang/v1/leases"
"""Where the lease API lives on the engine's HTTP port: GET it, POST `/release` and `/renew`."""
