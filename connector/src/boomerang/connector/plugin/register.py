"""A vLLM general plugin: put the decoder's `kv_transfer_params` on the final streamed chunk.

Why: with bidirectional KV transfer, D's response carries the handle the next turn needs
(`kv_transfer_params`: D's block ids, engine id, expiry). vLLM >= 0.33 puts it on the final
chunk of a stream; 0.21-0.32 only on non-streaming responses, which would force the router to
call D without streaming and lose real streaming for clients. This plugin gives 0.21-0.32 the
0.33 behaviour: a top-level `kv_transfer_params` on each chunk that carries a `finish_reason`.

How: vLLM calls `register()` in every process at start-up (entry point group
`vllm.general_plugins`). In the API server it wraps the chat and completion stream generators:
the engine's `RequestOutput`s are observed on their way in (the last non-empty
`kv_transfer_params` is kept), and each outgoing SSE event whose choices finished gets the field.
It makes the Responses and Messages answers of the router's P/D requests carry D's params and
token ids (`api_ids`: vLLM returns neither ids there, nor params on a streamed Messages answer).
It also applies three CPU fixes measured on the CPU build (`nixl_quiet`, `cpu_pinning`, and
`idle_loop`: an engine that only retains blocks for a later read waits instead of stepping), makes
D's worker track the blocks of requests D served alone (`own_requests`: without it vLLM 0.32
never frees them), lets D's retained leases yield to live work when its KV cache is full
(`pressure`, with the claims that keep that safe), and
publishes the engine's revision on `/metrics` (`revision`) for the router's P/D pairing.

Events are rewritten only when the request asked for KV transfer (the engine then returns
params); everything else passes through untouched. On vLLM >= 0.33 the stream patch steps aside
(vLLM does it) and says so in the log.

Every vLLM internal it touches is listed once, in `vllm_points`, and checked at start: on a vLLM
where one is missing or changed the plugin patches none of them, says so in one log line naming
the version and what is missing, and publishes its capabilities at 0 (`capability.refuse`), so
the router takes no path that needs them.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from boomerang.connector.plugin import vllm_points
from boomerang.facts.engine import (
    CONTINUE_CAPABILITY,
    ENGINE_CAPABILITY_METRIC,
    STREAMS_PARAMS_SINCE,
)


def _logger() -> logging.Logger:
    try:  # vLLM's logger is configured to print; a plain one would be silent
        from vllm.logger import init_logger

        vllm_logger: logging.Logger = init_logger("boomerang.connector.plugin.register")
        return vllm_logger
    except ImportError:
        return logging.getLogger("boomerang.connector.plugin.register")


logger = _logger()

_PATCHED = "__boomerang_stream_params__"


def with_params(event: str, params: dict[str, Any] | None) -> str:
    """One SSE event, with `kv_transfer_params` added if the event finishes a choice.

    Pure: the decision and the rewrite, testable without vLLM."""
    if params is None or not event.startswith("data: ") or '"finish_reason"' not in event:
        return event
    body = event[len("data: ") :].rstrip("\n")
    try:
        chunk = json.loads(body)
    except ValueError:
        return event
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list):
        return event
    if not any(isinstance(c, dict) and c.get("finish_reason") for c in choices):
        return event
    chunk["kv_transfer_params"] = params
    return "data: " + json.dumps(chunk, separators=(",", ":")) + "\n\n"


class _ParamsTap:
    """Passes the engine's outputs through and remembers the last `kv_transfer_params`."""

    def __init__(self, source: AsyncIterator[Any]) -> None:
        self._source = source
        self.params: dict[str, Any] | None = None

    def __aiter__(self) -> _ParamsTap:
        return self

    async def __anext__(self) -> Any:
        item = await self._source.__anext__()
        # Completions yield (prompt index, RequestOutput); chat yields RequestOutput.
        output = item[1] if isinstance(item, tuple) else item
        params = getattr(output, "kv_transfer_params", None)
        if params:
            self.params = dict(params)
        return item


def wrap_stream_generator(original: Callable[..., AsyncGenerator[str, None]]) -> Any:
    """Wrap a vLLM `*_stream_generator` method so finishing chunks carry the engine's params."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[str, None]:
        bound = signature.bind(*args, **kwargs)
        tap = _ParamsTap(bound.arguments["result_generator"])
        bound.arguments["result_generator"] = tap
        async for event in original(*bound.args, **bound.kwargs):
            yield with_params(event, tap.params)

    setattr(wrapper, _PATCHED, True)
    return wrapper


def needs_patch(version: str) -> bool:
    """vLLM before 0.33 does not put the params on streamed chunks."""
    return vllm_points.version_tuple(version) < STREAMS_PARAMS_SINCE


def register() -> None:
    """vLLM's entry point, called in every engine process: publish the engine revision, quiet
    NIXL's progress thread, and, where this vLLM has every internal the plugin patches
    (`vllm_points`), apply the patches it needs; else refuse them all (idempotent)."""
    try:
        import vllm
    except ImportError:  # not inside a vLLM process
        return
    from boomerang.connector.plugin import (
        api_ids,
        capability,
        cpu_pinning,
        idle_loop,
        nixl_quiet,
        own_requests,
        pressure,
        revision,
    )
    from boomerang.facts.engine import PRESSURE_CAPABILITY

    version = str(getattr(vllm, "__version__", "0"))
    if (published := revision.publish()) is not None:
        logger.debug("boomerang: engine revision %s published on /metrics", published)
    if nixl_quiet.apply():
        logger.debug("boomerang: NIXL progress thread delay raised")
    if missing := vllm_points.missing(version):
        _refuse(version, missing)
        capability.refuse()
        return
    if not vllm_points.supported(version):
        _say_once(
            "untested",
            logging.WARNING,
            f"boomerang: vLLM {version} is not one this plugin was checked against "
            f"({', '.join(vllm_points.SUPPORTED_VLLM)}); every internal it patches is present: "
            "patching",
        )
    continues = own_requests.apply()
    if continues:
        logger.debug("boomerang: D's own requests are announced to the NIXL worker")
    capability.publish(CONTINUE_CAPABILITY, continues)  # the router may continue turns on D
    yields = pressure.apply()
    if yields:
        logger.debug("boomerang: D's retained leases yield to live work; routers claim first")
    capability.publish(PRESSURE_CAPABILITY, yields)  # the router claims before every pull
    if cpu_pinning.apply():
        logger.debug("boomerang: KV transfer thread pinned per BOOMERANG_KV_CPUS")
    if period := idle_loop.apply():
        logger.debug("boomerang: an engine that only retains blocks steps every %g s", period)
    _patch_streams(version)
    for api in api_ids.apply():
        logger.info("boomerang: %s answers now carry D's params and token ids", api)


_said: set[str] = set()


def _say_once(key: str, level: int, message: str) -> None:
    """One log line per process (vLLM may load its plugins more than once)."""
    if key not in _said:
        _said.add(key)
        logger.log(level, message)


def _refuse(version: str, missing: list[str]) -> None:
    _say_once(
        "refused",
        logging.ERROR,
        f"boomerang: vLLM {version} cannot be patched by this plugin (checked against "
        f"{', '.join(vllm_points.SUPPORTED_VLLM)}); missing: {'; '.join(missing)}. Patching none "
        f"of vLLM's internals; {ENGINE_CAPABILITY_METRIC} published at 0",
    )


def _patch_streams(version: str) -> None:
    import importlib

    if not needs_patch(version):
        logger.info("boomerang: vLLM %s streams kv_transfer_params itself; not patching", version)
        return
    for point in vllm_points.STREAMS:
        class_name, method_name = point.name.split(".")
        cls = getattr(importlib.import_module(point.module), class_name)  # checked at start
        method = getattr(cls, method_name)
        if getattr(method, _PATCHED, False):
            continue
        setattr(cls, method_name, wrap_stream_generator(method))
        logger.info("boomerang: %s now ends its streams with kv_transfer_params", class_name)
