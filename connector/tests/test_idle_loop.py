"""The idle wait on a stand-in engine core whose loop is vLLM's in miniature (an input step, then
a step): while it only retains blocks it steps about once a period, any input wakes it for one
step at once, and live work never waits. No vLLM needed."""

from __future__ import annotations

import queue
import sys
import threading
import time
import types
from typing import Any

import pytest

from boomerang.connector.plugin import idle_loop
from boomerang.connector.plugin.idle_policy import DEFAULT_IDLE_STEP_S

PERIOD = 0.3


class Request:
    def __init__(self, finished: bool) -> None:
        self.finished = finished

    def is_finished(self) -> bool:
        return self.finished


class Connector:
    def __init__(self) -> None:
        self.push = False

    def has_pending_push_work(self) -> bool:
        return self.push


class Scheduler:
    def __init__(self) -> None:
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.connector: Connector | None = Connector()
        self.ec_connector = None


class Core:
    """vLLM's EngineCoreProc loop, reduced to what the hook relies on."""

    def __init__(self) -> None:
        self.input_queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.scheduler = Scheduler()
        self.batch_queue = None
        self.engines_running = False
        self.process_input_queue_block = True
        self.handled: list[tuple[str, Any]] = []
        self.steps = 0

    def is_running(self) -> bool:
        return True

    def has_work(self) -> bool:
        return self.engines_running or bool(self.scheduler.requests)

    def _handle_client_request(self, request_type: str, request: Any) -> None:
        self.handled.append((request_type, request))
        if request_type == "ADD":
            self.scheduler.requests[request] = Request(finished=False)
        if request == "state":  # a utility that only reads, as the lease API's poll
            idle_loop.needs_no_step(self)

    def _process_input_queue(self) -> None:
        while not self.has_work():
            self._handle_client_request(*self.input_queue.get(block=True))
        while not self.input_queue.empty():
            self._handle_client_request(*self.input_queue.get_nowait())

    def step(self) -> None:
        self.steps += 1


class Hooked(Core):
    _process_input_queue = idle_loop.wrap_process_input_queue(Core._process_input_queue, PERIOD)
    _handle_client_request = idle_loop.wrap_handle_client_request(Core._handle_client_request)


def retaining(core: Core) -> Core:
    core.scheduler.requests["done"] = Request(finished=True)
    return core


def timed(call: Any) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def test_a_retaining_engine_waits_out_the_period_before_its_next_step() -> None:
    core = retaining(Hooked())
    assert timed(core._process_input_queue) < 0.1  # the first pass steps
    assert PERIOD * 0.9 <= timed(core._process_input_queue) < PERIOD + 0.5


def test_an_input_wakes_a_waiting_engine_at_once_and_is_handled() -> None:
    core = retaining(Hooked())
    core._process_input_queue()
    threading.Timer(0.05, core.input_queue.put, [("UTILITY", "release")]).start()
    assert timed(core._process_input_queue) < PERIOD * 0.7
    assert core.handled == [("UTILITY", "release")]


def test_a_utility_call_that_needs_no_step_is_answered_at_once_and_the_wait_goes_on() -> None:
    core = retaining(Hooked())
    core._process_input_queue()
    answered: list[float] = []
    original = core._handle_client_request

    def handle(*request: Any) -> None:
        original(*request)
        answered.append(time.monotonic())

    core._handle_client_request = handle  # type: ignore[method-assign,assignment]
    for delay in (0.05, 0.1):  # the lease API's poll of the retained state, twice
        threading.Timer(delay, core.input_queue.put, [("UTILITY", "state")]).start()
    started = time.monotonic()
    assert timed(core._process_input_queue) >= PERIOD * 0.9  # no step was owed for them
    assert core.handled == [("UTILITY", "state")] * 2
    assert answered[-1] - started < PERIOD * 0.7  # each answered as it came


def test_a_queue_it_cannot_wait_on_leaves_vllms_loop_as_it_was() -> None:
    core = retaining(Hooked())
    core._process_input_queue()
    core.input_queue = types.SimpleNamespace(empty=lambda: True)  # type: ignore[assignment]
    assert timed(core._process_input_queue) < 0.1


def test_an_input_handled_during_the_step_gets_the_next_step_at_once() -> None:
    core = retaining(Hooked())
    core._process_input_queue()
    core._handle_client_request("ABORT", ["r"])  # as vLLM 0.34 does while a step runs
    assert timed(core._process_input_queue) < 0.1
    assert timed(core._process_input_queue) >= PERIOD * 0.9  # then idle again


@pytest.mark.parametrize(
    "busy",
    [
        lambda core: core.scheduler.running.append(Request(finished=False)),
        lambda core: core.scheduler.requests.update(pulling=Request(finished=False)),
        lambda core: core.scheduler.finished_req_ids.add("done"),
        lambda core: setattr(core.scheduler.connector, "push", True),
        lambda core: setattr(core.scheduler, "ec_connector", object()),
        lambda core: setattr(core, "batch_queue", [object()]),
        lambda core: setattr(core, "engines_running", True),
        lambda core: setattr(core, "process_input_queue_block", False),
        lambda core: delattr(core.scheduler, "finished_req_ids"),  # not the layout checked
    ],
)
def test_live_work_never_waits(busy: Any) -> None:
    core = retaining(Hooked())
    core._process_input_queue()
    busy(core)
    assert timed(core._process_input_queue) < 0.1


def test_an_idle_retaining_loop_steps_about_once_a_period_instead_of_continuously() -> None:
    def run(core: Core, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            core._process_input_queue()
            core.step()
            time.sleep(0.001)  # vLLM's own pause after a step that ran no model
        return core.steps

    assert run(retaining(Core()), 0.5) > 50  # vLLM's loop: about every millisecond
    assert run(retaining(Hooked()), 1.0) <= 1 + 1.0 / PERIOD + 1


def test_the_loop_of_an_engine_holding_nothing_is_vllms_own() -> None:
    core = Hooked()
    threading.Timer(0.05, core.input_queue.put, [("ADD", "r1")]).start()
    core._process_input_queue()  # vLLM's own blocking wait, ended by the request
    assert core.handled == [("ADD", "r1")]
    assert timed(core._process_input_queue) < 0.1  # now running: no wait


def test_apply_patches_vllms_engine_loop_once_and_zero_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine_core = types.ModuleType("vllm.v1.engine.core")
    engine_core.EngineCoreProc = type(  # type: ignore[attr-defined]
        "EngineCoreProc",
        (),
        {
            "_process_input_queue": Core._process_input_queue,
            "_handle_client_request": Core._handle_client_request,
        },
    )
    for name in ("vllm", "vllm.v1", "vllm.v1.engine"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.core", engine_core)
    cls = engine_core.EngineCoreProc

    assert idle_loop.apply({"BOOMERANG_IDLE_STEP_S": "0"}) == 0
    assert cls._process_input_queue is Core._process_input_queue
    assert idle_loop.apply({}) == DEFAULT_IDLE_STEP_S
    wrapped = cls._process_input_queue
    assert getattr(wrapped, "__boomerang_idle__", False)
    assert idle_loop.apply({}) == DEFAULT_IDLE_STEP_S
    assert cls._process_input_queue is wrapped  # not wrapped twice
    assert getattr(cls._handle_client_request, "__boomerang_idle__", False)


@pytest.mark.parametrize(("op", "quiet"), [("state", True), ("claim", True), ("yield", False)])
def test_the_lease_apis_reads_and_claims_need_no_step_but_a_yield_does(
    op: str, quiet: bool
) -> None:
    from boomerang.connector.plugin import pressure

    owner = types.SimpleNamespace()
    connector = types.SimpleNamespace(connector_scheduler=owner)
    scheduler = types.SimpleNamespace(connector=connector, requests={}, kv_cache_manager=None)
    core = retaining(Hooked())
    core._process_input_queue()  # the loop stepped
    core.scheduler = scheduler  # type: ignore[assignment]
    core._handle_client_request = types.MethodType(  # type: ignore[method-assign]
        idle_loop.wrap_handle_client_request(
            lambda self, kind, args: pressure.retained_utility(self, *args)
        ),
        core,
    )
    core._handle_client_request("UTILITY", (op, [], 5.0))
    last_step = vars(core)["_boomerang_last_step"]
    assert (getattr(core, "_boomerang_last_input", 0.0) < last_step) is quiet
