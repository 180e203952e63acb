"""The engine's lease API without vLLM: parsing, the worker-side bookkeeping on a stand-in of
vLLM 0.32's NIXL worker, and the ASGI middleware (routes, auth, errors, pass-through) in front
of a fake engine client that runs the real worker extension in-process."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from boomerang.connector import config
from boomerang.connector.plugin import lease_api, leases, pressure
from boomerang.connector.plugin.retained import RetainedBook
from boomerang.facts import engine as names

TOKEN = "s3cret-token"


class FakeKV:
    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return {"decoder_kv_blocks_ttl": 480}.get(key, default)


class FakeNixlWorker:
    """The parts of vLLM 0.32's NixlBaseConnectorWorker that the lease calls touch."""

    def __init__(self, leases_by_id: dict[str, float]) -> None:
        self._reqs_to_send = dict(leases_by_id)
        self._reqs_to_process = set(leases_by_id)
        self.consumer_notification_counts_by_req: defaultdict[str, int] = defaultdict(int)
        self.expected_consumer_notifications_by_req: dict[str, int] = {}
        self.vllm_config = SimpleNamespace(kv_transfer_config=FakeKV())
        self.expired = 0

    def _reap_expired_send_leases(self, done_sending: set[str]) -> None:
        for req_id in [r for r, t in self._reqs_to_send.items() if t <= 0]:
            del self._reqs_to_send[req_id]
            self.expired += 1
            done_sending.add(req_id)


def test_parse_request_dedups_ids_and_validates_seconds() -> None:
    body = json.dumps({"request_ids": ["a", "b", "a"], "seconds": 30}).encode()
    assert leases.parse_request(body, renew=True) == (["a", "b"], 30.0)
    assert leases.parse_request(b'{"request_ids": []}', renew=True) == ([], None)
    assert leases.parse_request(body, renew=False) == (["a", "b"], None)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'{"request_ids": "a"}',
        b'{"request_ids": [1]}',
        b'{"request_ids": [""]}',
        b'{"request_ids": ["a"], "seconds": 0}',
        b'{"request_ids": ["a"], "seconds": -1}',
        b'{"request_ids": ["a"], "seconds": "10"}',
        b'{"request_ids": ["a"], "seconds": true}',
        b'{"request_ids": ["a"], "seconds": NaN}',
    ],
)
def test_malformed_bodies_are_400_with_a_message(raw: bytes) -> None:
    with pytest.raises(leases.LeaseError) as caught:
        leases.parse_request(raw, renew=True)
    assert caught.value.status == 400
    assert caught.value.body()["error"]["message"]


def test_seconds_are_clamped_to_the_ceiling() -> None:
    assert leases.clamp_seconds(10.0, 480.0) == 10.0
    assert leases.clamp_seconds(1e9, 480.0) == 480.0
    assert leases.clamp_seconds(None, 480.0) == 480.0


def test_release_frees_on_the_next_reap_without_counting_an_expiry() -> None:
    worker = FakeNixlWorker({"r1": 100.0, "r2": 100.0, "old": 0.0})
    worker.consumer_notification_counts_by_req["r1"] = 1
    worker.expected_consumer_notifications_by_req["r1"] = 2
    assert leases.release(worker, ["r1", "nope"]) == {"released": ["r1"], "unknown": ["nope"]}
    assert "r1" not in worker._reqs_to_send and "r1" not in worker._reqs_to_process
    assert "r1" not in worker.consumer_notification_counts_by_req
    assert "r1" not in worker.expected_consumer_notifications_by_req

    done: set[str] = set()
    worker._reap_expired_send_leases(done)
    assert done == {"r1", "old"} and worker.expired == 1  # only the real expiry counts
    done = set()
    worker._reap_expired_send_leases(done)
    assert done == set()  # handed over once
    leases.release(worker, ["r2"])
    worker._reap_expired_send_leases(done)  # wrapped once, still releases
    assert done == {"r2"}


def test_renew_moves_deadlines_later_never_earlier() -> None:
    worker = FakeNixlWorker({"soon": 110.0, "late": 900.0})
    result = leases.renew(worker, ["soon", "late", "gone"], 60.0, now=100.0)
    assert result == {"renewed": {"soon": 160.0, "late": 900.0}, "unknown": ["gone"]}
    assert worker._reqs_to_send == {"soon": 160.0, "late": 900.0}


def test_renewals_never_keep_blocks_past_one_more_ttl() -> None:
    """A client renewing again and again: each renewal moves the deadline, but never beyond
    one ceiling past the deadline vLLM set when the request finished."""
    worker = FakeNixlWorker({"r": 580.0})  # finished at 100 with a 480 s TTL
    for now in (500.0, 700.0, 900.0, 1100.0):
        leases.renew(worker, ["r"], 480.0, now=now, ceiling=480.0)
    assert worker._reqs_to_send == {"r": 580.0 + 480.0}
    del worker._reqs_to_send["r"]  # released: its origin is forgotten on the next call
    worker._reqs_to_send["s"] = 100.0
    leases.renew(worker, ["s"], 30.0, now=90.0, ceiling=480.0)
    assert getattr(worker, leases.ORIGINS) == {"s": 100.0}
    assert worker._reqs_to_send["s"] == 120.0


def test_another_vllm_is_reported_not_guessed() -> None:
    assert leases.missing_internals(None) == ["connector_worker"]
    assert "_reqs_to_send" in leases.missing_internals(SimpleNamespace())
    assert leases.missing_internals(FakeNixlWorker({})) == []


def test_ranks_merge_to_one_answer() -> None:
    ranks = [
        {"supported": True, "renewed": {"a": 10.0}, "unknown": ["b"], "ceiling_s": 480},
        {"supported": True, "renewed": {"a": 9.5}, "unknown": ["b"], "ceiling_s": 480},
    ]
    assert leases.merge(ranks) == {"renewed": {"a": 9.5}, "unknown": ["b"], "ceiling_s": 480}
    with pytest.raises(leases.LeaseError) as caught:
        leases.merge([{"supported": False, "missing": ["_reqs_to_send"]}])
    assert caught.value.status == 501


def test_both_roles_load_the_lease_extension() -> None:
    engine = config.EngineSettings(model="m", served_model_name="m")
    for role in names.ROLES:
        args = config.engine_args(role, engine, config.KVTransferSettings())
        assert args[args.index("--middleware") + 1] == config.LEASE_MIDDLEWARE
        assert args[args.index("--worker-extension-cls") + 1] == config.LEASE_WORKER_EXTENSION
    module, _, name = config.LEASE_MIDDLEWARE.rpartition(".")
    assert module == lease_api.__name__ and hasattr(lease_api, name)
    assert hasattr(leases, config.LEASE_WORKER_EXTENSION.rpartition(".")[2])


# --- the middleware ---------------------------------------------------------------------------


class FakeEngineCore:
    """The engine core as the API server reaches it: a utility call runs the retained book's
    utility on a scheduler whose requests are the book's leases."""

    def __init__(self, book: RetainedBook | None) -> None:
        owner = SimpleNamespace()
        if book is not None:
            owner._boomerang_retained = book
        manager = SimpleNamespace(get_block_ids=lambda rid: ([1, 2],))
        requests = book.leases if book is not None else {}
        scheduler = SimpleNamespace(
            connector=SimpleNamespace(connector_scheduler=owner if book else None),
            requests=requests,
            kv_cache_manager=manager,
        )
        self.core = SimpleNamespace(scheduler=scheduler)

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        assert method == pressure.UTILITY
        return pressure.retained_utility(self.core, *args)


class FakeEngineClient:
    """vLLM's engine client as the API server holds it: collective_rpc runs the extension."""

    def __init__(
        self, fail: Exception | None = None, book: RetainedBook | None = None, stall_s: float = 0
    ) -> None:
        self.fail = fail
        self.stall_s = stall_s
        self.calls: list[str] = []
        self.timeouts: list[float | None] = []
        self.engine_core = FakeEngineCore(book)

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = ()):
        self.calls.append(method)
        self.timeouts.append(timeout)
        await asyncio.sleep(self.stall_s)
        if self.fail is not None:
            raise self.fail
        return [getattr(leases.LeaseWorker(), method)(*args)]


async def downstream(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


async def call(
    app, method: str, path: str, body: Any = None, token: str | None = TOKEN, client=None
) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body else b""
    headers = [(b"authorization", f"Bearer {token}".encode())] if token is not None else []
    state = SimpleNamespace(engine_client=client or FakeEngineClient())
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers,
        "app": SimpleNamespace(state=state),
    }
    sent: list[dict[str, Any]] = []

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    status = sent[0]["status"]
    return status, payload if status == 299 else json.loads(payload)


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> FakeNixlWorker:
    fake = FakeNixlWorker({"held-1": 1e12, "held-2": 1e12})
    monkeypatch.setattr(leases, "nixl_worker", lambda: fake)
    return fake


def app(env: dict[str, str] | None = None) -> lease_api.LeaseControl:
    return lease_api.LeaseControl(
        downstream, env={names.LEASE_TOKEN_ENV: TOKEN} if env is None else env
    )


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_get_reports_held_leases_ceiling_and_version(worker) -> None:
    status, body = await call(app(), "GET", names.LEASE_PATH)
    assert status == 200
    assert body["held"] == 2 and body["ceiling_s"] == 480.0 and isinstance(body["vllm"], str)


async def test_release_answers_released_and_unknown_and_counts(worker) -> None:
    before = counter(lease_api.RELEASED_METRIC)
    path = f"{names.LEASE_PATH}/release"
    status, body = await call(app(), "POST", path, {"request_ids": ["held-1", "nope"]})
    assert (status, body) == (200, {"released": ["held-1"], "unknown": ["nope"]})
    assert counter(lease_api.RELEASED_METRIC) == before + 1
    assert list(worker._reqs_to_send) == ["held-2"]


async def test_renew_returns_the_new_deadline_clamped_to_the_ceiling(worker) -> None:
    worker._reqs_to_send["held-1"] = 0.0
    before = counter(lease_api.RENEWED_METRIC)
    path = f"{names.LEASE_PATH}/renew"
    status, body = await call(app(), "POST", path, {"request_ids": ["held-1", "x"], "seconds": 1e6})
    assert status == 200 and body["unknown"] == ["x"] and body["ceiling_s"] == 480.0
    deadline = body["renewed"]["held-1"]
    assert 0 < deadline <= leases.time.perf_counter() + 480.0
    assert worker._reqs_to_send["held-1"] == deadline
    assert counter(lease_api.RENEWED_METRIC) == before + 1


@pytest.mark.parametrize(
    ("env", "token", "status"),
    [({}, TOKEN, 403), (None, None, 401), (None, "wrong", 401), (None, "", 401)],
)
async def test_auth(worker, env, token, status) -> None:
    code, body = await call(app(env), "GET", names.LEASE_PATH, token=token)
    assert code == status and set(body["error"]) == {"message", "type"}


async def test_errors_are_json_400_405_501(worker) -> None:
    code, body = await call(app(), "POST", f"{names.LEASE_PATH}/release", b"{")
    assert code == 400 and "JSON" in body["error"]["message"]
    code, _ = await call(app(), "GET", f"{names.LEASE_PATH}/release")
    assert code == 405
    missing = FakeEngineClient(fail=NotImplementedError("Method 'boomerang_lease_held'"))
    code, body = await call(app(), "GET", names.LEASE_PATH, client=missing)
    assert code == 501 and body["error"]["type"] == "not_supported"


async def test_a_slow_worker_is_a_504_and_the_engine_is_never_given_a_deadline(
    worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's executor, given a timeout, leaves the late answer in the queue its next model
    step reads (the engine dies): the wait is bounded here instead."""
    monkeypatch.setattr(lease_api, "RPC_TIMEOUT_S", 0.05)
    slow = FakeEngineClient(stall_s=1.0)
    code, body = await call(app(), "GET", names.LEASE_PATH, client=slow)
    assert code == 504 and body["error"]["type"] == "timeout"
    assert slow.timeouts == [None]


async def test_an_unsupported_vllm_is_501(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leases, "nixl_worker", lambda: SimpleNamespace(_reqs_to_send={}))
    code, body = await call(app(), "POST", f"{names.LEASE_PATH}/release", {"request_ids": ["a"]})
    assert code == 501 and "_reap_expired_send_leases" in body["error"]["message"]


async def test_everything_else_passes_through_untouched(worker) -> None:
    client = FakeEngineClient()
    for path in ("/v1/completions", "/metrics", f"{names.LEASE_PATH}/other", "/boomerang"):
        assert await call(app(), "POST", path, {"x": 1}, client=client) == (299, b"app")
    assert await call(app({}), "GET", "/health", token=None) == (299, b"app")
    assert client.calls == []


# --- the local runtime's token -------------------------------------------------------------


def test_the_local_runtime_makes_one_private_token_per_run_dir(tmp_path) -> None:
    from boomerang.local import stack

    path = stack.lease_token_file(tmp_path)
    token = stack.read_lease_token(tmp_path)
    assert len(token) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert stack.lease_token_file(tmp_path) == path and stack.read_lease_token(tmp_path) == token
    assert stack.read_lease_token(tmp_path / ".." / tmp_path.name) == token
    other = tmp_path / "other"
    other.mkdir()
    assert stack.read_lease_token(other) != token

    dd = stack.load_manifest(stack.DEFAULT_MANIFEST)
    for role in names.ROLES:
        spec = stack.engine_spec(
            dd,
            role,
            engine_venv=tmp_path,
            ports=stack.LocalPorts(),
            run_dir=tmp_path,
            base_env={},
            lease_token=token,
        )
        assert spec.env[names.LEASE_TOKEN_ENV] == token
    settings = stack.router_settings(dd, stack.LocalPorts(), lease_token_file=str(path))
    assert settings["lease_token_file"] == str(path)


# --- claims and the retained state (the engine core's book) --------------------------------


def book_with(*ids: str) -> RetainedBook:
    book = RetainedBook()
    for i, rid in enumerate(ids):
        book.retained(rid, float(i), 100.0 + i)
    return book


async def test_claim_answers_held_and_gone_and_a_claimed_lease_never_yields(worker) -> None:
    book = book_with("a", "b", "c")
    assert book.yielding(2, lambda rid: 2, time.perf_counter()) == [
        "a"
    ]  # under pressure: "a" yields first
    client = FakeEngineClient(book=book)
    path = f"{names.LEASE_PATH}/claim"
    status, body = await call(app(), "POST", path, {"request_ids": ["a", "b", "x"]}, client=client)
    assert (status, body) == (200, {"held": ["b"], "gone": ["a", "x"]})
    assert book.yielding(10, lambda rid: 2, time.perf_counter()) == [
        "c"
    ]  # "b" is claimed: only "c" may yield
    path = f"{names.LEASE_PATH}/unclaim"
    status, body = await call(app(), "POST", path, {"request_ids": ["b"]}, client=client)
    assert (status, body) == (200, {"unclaimed": ["b"]})


async def test_get_reports_the_retained_state_beside_the_held_leases(worker) -> None:
    client = FakeEngineClient(book=book_with("a", "b"))
    status, body = await call(app(), "GET", names.LEASE_PATH, client=client)
    assert status == 200 and body["held"] == 2
    assert body["retained"]["retained"] == 2 and body["retained"]["retained_blocks"] == 4


async def test_claims_on_an_engine_without_a_book_are_501(worker) -> None:
    path = f"{names.LEASE_PATH}/claim"
    status, body = await call(app(), "POST", path, {"request_ids": ["a"]})
    assert status == 501 and body["error"]["type"] == "not_supported"
    status, body = await call(app(), "GET", names.LEASE_PATH)
    assert status == 200 and "retained" not in body


async def test_a_renewal_moves_the_lease_back_in_the_yield_order(worker) -> None:
    book = book_with("held-1", "held-2")
    path = f"{names.LEASE_PATH}/renew"
    client = FakeEngineClient(book=book)
    status, _ = await call(app(), "POST", path, {"request_ids": ["held-1"]}, client=client)
    assert status == 200
    assert book.yielding(1, lambda rid: 1, time.perf_counter()) == ["held-2"]


def test_published_state_sets_gauges_and_counts_what_yielded_once() -> None:
    seen: dict[str, int] = {}
    before = counter(lease_api.YIELDED_METRIC)
    state = {"retained": 3, "retained_blocks": 12, "claimed": 1, "pressure_released": 2}
    lease_api.publish_state(state, seen)
    lease_api.publish_state(state, seen)
    assert counter(lease_api.YIELDED_METRIC) == before + 2
    assert REGISTRY.get_sample_value("boomerang_engine_retained_blocks") == 12
