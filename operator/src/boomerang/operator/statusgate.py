"""One status refresh at a time per resource, and what the refreshes share between them.

The kopf handlers run in a thread pool and several of them refresh a resource's status (its
own events, its workloads', its pods', the repair timer, the router poll). The gate keeps one
refresh per resource running, coalesces the ones that arrive meanwhile, and holds what a full
reconcile or the router poll found for the refreshes in between (reconcile.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class StatusGate:
    """Serialise status refreshes per resource, coalescing the ones that pile up.

    Handlers run in a thread pool. A refresh requested while another runs for the same
    resource does not wait (a blocked thread would starve the pool during event storms): it
    marks the resource dirty and returns; the running refresh then goes round once more, so
    the last status written is always computed after the last event arrived.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._running: set[tuple[str, str]] = set()
        self._dirty: set[tuple[str, str]] = set()
        self.errors: dict[tuple[str, str], str | None] = {}
        """Per resource: the failure of its last full reconcile (None: it succeeded)."""
        self.capacity: dict[tuple[str, str], dict[str, str]] = {}
        """Per resource: its last full reconcile's preflight shortfalls, by role."""
        self.learned: dict[tuple[str, str], dict[str, Any]] = {}
        """Per Adaptive resource: what its router last reported it learned (tuning.learned)."""

    def run_once(self, key: tuple[str, str], fn: Callable[[], T]) -> T | None:
        with self._guard:
            if key in self._running:
                self._dirty.add(key)
                return None
            self._running.add(key)
        try:
            while True:
                outcome = fn()
                with self._guard:
                    if key not in self._dirty:
                        self._running.discard(key)
                        return outcome
                    self._dirty.discard(key)
        except BaseException:
            with self._guard:
                self._running.discard(key)
                self._dirty.discard(key)
            raise
