"""Per-engine capability: can D stream and still hand back its retained-KV params?

vLLM >= 0.33 puts `kv_transfer_params` on the final streamed chunk; 0.21-0.32 only on
non-streaming responses, unless Boomerang's vLLM plugin adds it to the final chunk. The router
does not hard-code either: it reads `/version` from each engine (prober) and observes streams.

Decision for a streaming client (pure, `decode_mode`):
- known to stream params (observed, or version >= 0.33 not yet contradicted) -> stream;
- not known yet -> stream and observe: the final chunk either carries params (capable) or not;
- known not to -> `stream_without_params`: `buffer` (default) calls D without streaming and
  re-emits the answer as SSE, keeping reuse at the cost of incremental delivery; `stream`
  keeps incremental delivery and gives up reuse for that turn.
An observation of "no params" is re-checked after `RECHECK_S` (an engine may have been
restarted with the plugin), so at most one turn per engine and period loses reuse.
"""

from __future__ import annotations

import re
from typing import Literal

from boomerang.facts.engine import STREAMS_PARAMS_SINCE
from boomerang.router.config import RouterConfig
from boomerang.router.engines.endpoints import Endpoint

DecodeMode = Literal["json", "stream", "buffer"]
RECHECK_S = 600.0


def version_tuple(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string such as "0.32.0" or "0.33.1rc2+cpu"."""
    if not version:
        return None
    m = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def streams_params(ep: Endpoint, now: float) -> bool | None:
    """What the router believes about `ep` now (None: unknown, to be observed)."""
    if ep.stream_params is True:
        return True
    if ep.stream_params is False and now - ep.stream_params_at < RECHECK_S:
        return False
    if ep.stream_params is None:
        v = version_tuple(ep.version)
        if v is not None and v >= STREAMS_PARAMS_SINCE:
            return True
    return None


def decode_mode(
    client_stream: bool, ep: Endpoint, config: RouterConfig, now: float, can_buffer: bool = True
) -> DecodeMode:
    """How to call D for this client (see the module docstring); an API whose answer cannot
    be re-emitted from D's JSON (`can_buffer` false: Responses, Messages) always streams."""
    if not client_stream:
        return "json"
    if not (config.bidirectional and can_buffer) or config.decode_stream_params == "yes":
        return "stream"
    capable = False if config.decode_stream_params == "no" else streams_params(ep, now)
    if capable is not False:
        return "stream"
    return "stream" if config.stream_without_params == "stream" else "buffer"


def observe_stream(ep: Endpoint, carried_params: bool, now: float) -> None:
    """Record what a completed stream from `ep` showed."""
    ep.stream_params = carried_params
    ep.stream_params_at = now
