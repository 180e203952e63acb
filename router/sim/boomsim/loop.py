"""Simulated time: a heap of (time, sequence, callback, argument).

Why this small: the simulator's speed is this loop's speed. A callback with one argument and
no event objects keeps a scheduled event to one tuple; the sequence number keeps events at one
instant in the order they were scheduled (deterministic runs)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class Loop:
    __slots__ = ("_heap", "_seq", "events", "now")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.events = 0

    def at(self, t: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Run `fn(arg)` at simulated time `t` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (t if t > self.now else self.now, self._seq, fn, arg))

    def run(self, until: float = float("inf")) -> None:
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until:
            t, _, fn, arg = pop(heap)
            self.now = t
            self.events += 1
            fn(arg)
