"""The operator's Prometheus metrics: how its reconciles go, and how many resources are Ready.

Served on `--metrics-port` (default 8081, `GET /metrics`) by the operator process, apart from
kopf's liveness endpoint. Names (keep them stable: the chart's alerts and dashboard read them):
- `boomerang_operator_reconciles_total{result}`: full reconciles (create, update, resume, the
  repair timer, a child's drift), by result: `ok` (every child applied), `error` (a child failed
  to apply, or the reconcile raised), `invalid` (the spec is rejected by the model: status says
  `InvalidSpec`);
- `boomerang_operator_reconcile_errors_total{reason}`: the failed ones, by why: `apply` (a child
  was refused; the resource is Degraded with `ReconcileFailed`) or `exception` (the reconcile
  raised; kopf retries it);
- `boomerang_operator_reconcile_duration_seconds`: the time each full reconcile took;
- `boomerang_operator_resources{ready}`: resources by their Ready condition (`True`, `False`,
  `Unknown`), as last computed by a reconcile or a status refresh of this process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from boomerang.operator.reconcile import Outcome

PORT = 8081
RESULTS = ("ok", "error", "invalid")
ERROR_REASONS = ("apply", "exception")
READY_STATES = ("True", "False", "Unknown")
_DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

Key = tuple[str, str]  # (namespace, name)


def key_of(body: Mapping[str, Any]) -> Key:
    """The resource's (namespace, name), as the reconciler keys it."""
    meta = body.get("metadata", {})
    return str(meta.get("namespace") or "default"), str(meta.get("name"))


def result_of(outcome: Outcome, error: str | None) -> str:
    """ok, error or invalid: `error` is the reconcile's recorded failure (None: none)."""
    if outcome.invalid:
        return "invalid"
    return "error" if error is not None else "ok"


def ready_of(status: Mapping[str, Any]) -> str | None:
    """The Ready condition's status; None when the status has no conditions (nothing computed)."""
    conditions = status.get("conditions") or []
    for cond in conditions:
        if cond.get("type") == "Ready":
            return str(cond.get("status", "Unknown"))
    return "Unknown" if conditions else None


class OperatorMetrics:
    """Every metric the operator exports, in its own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "boomerang_operator_"
        self.reconciles = Counter(
            p + "reconciles", "Full reconciles, by result.", ["result"], registry=r
        )
        self.errors = Counter(
            p + "reconcile_errors", "Failed reconciles, by reason.", ["reason"], registry=r
        )
        self.duration = Histogram(
            p + "reconcile_duration_seconds",
            "Time a full reconcile took.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.resources = Gauge(
            p + "resources", "Resources by their Ready condition.", ["ready"], registry=r
        )
        for result in RESULTS:
            self.reconciles.labels(result)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)
        for state in READY_STATES:
            self.resources.labels(state).set(0)
        self._guard = threading.Lock()
        self._ready: dict[Key, str] = {}

    def reconciled(
        self, key: Key, run: Callable[[], Outcome], error_of: Callable[[], str | None]
    ) -> Outcome:
        """Run one full reconcile of `key`, counting its result, duration and Ready state.

        `error_of` tells, after the run, the failure the reconcile recorded (None: none)."""
        start = time.perf_counter()
        try:
            outcome = run()
        except Exception:
            self.reconciles.labels("error").inc()
            self.errors.labels("exception").inc()
            raise
        finally:
            self.duration.observe(time.perf_counter() - start)
        result = result_of(outcome, error_of())
        self.reconciles.labels(result).inc()
        if result == "error":
            self.errors.labels("apply").inc()
        self.observe_status(key, outcome.status)
        return outcome

    def observe_status(self, key: Key, status: Mapping[str, Any]) -> None:
        """Record the resource's Ready state from a status just computed (empty: no change)."""
        state = ready_of(status)
        if state is not None:
            with self._guard:
                self._ready[key] = state
                self._publish()

    def forget(self, key: Key) -> None:
        """The resource is gone: it no longer counts."""
        with self._guard:
            if self._ready.pop(key, None) is not None:
                self._publish()

    def _publish(self) -> None:
        counts = dict.fromkeys(READY_STATES, 0)
        for state in self._ready.values():
            counts[state if state in counts else "Unknown"] += 1
        for state, n in counts.items():
            self.resources.labels(state).set(n)


def serve(metrics: OperatorMetrics, port: int, addr: str = "0.0.0.0") -> WSGIServer | None:
    """Serve `GET /metrics` from a daemon thread (`shutdown()` stops it); port 0: nothing."""
    if not port:
        return None
    server, _ = start_http_server(port, addr=addr, registry=metrics.registry)
    return server
