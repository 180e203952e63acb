"""`bench_procs` and `wake_cost`: the counters the router benchmarks read from /proc, and the
wake-up probe that explains their rows at one conversation."""

from __future__ import annotations

import os
import time

import pytest
from bench_procs import cpu_seconds, io_calls, wakes
from wake_cost import CONNECTIONS, SERVERS, Row, measure, wake_cost


def test_the_counters_move_with_what_the_process_does() -> None:
    pid = os.getpid()
    woken, calls, cpu = wakes(pid), io_calls(pid), cpu_seconds(pid)
    time.sleep(0.005)  # a voluntary sleep: one context switch at least
    with open("/proc/self/stat", "rb") as f:
        f.read()
    end = time.process_time() + 0.05
    while time.process_time() < end:  # more than one clock tick of CPU
        pass
    assert wakes(pid) > woken
    assert io_calls(pid) > calls
    assert cpu_seconds(pid) > cpu


def _row(connections: int, requests: int, cpu_s: float, woken: int) -> Row:
    return Row("echo", connections, requests, 1.0, cpu_s, woken)


def test_a_wake_costs_the_extra_cpu_over_the_extra_wakes() -> None:
    busiest = _row(64, 1000, 0.004, 20)  # 4 µs and 0.02 wakes per request
    idle = _row(1, 1000, 0.034, 1000)  # 34 µs and 1 wake per request
    assert wake_cost(idle, busiest) == pytest.approx(30e-6 / 0.98)
    assert wake_cost(_row(4, 1000, 0.01, 300), busiest) is None  # 0.28 extra wakes: no slope
    assert wake_cost(busiest, busiest) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the server needs a CPU of its own")
@pytest.mark.parametrize("server", SERVERS)
def test_one_connection_wakes_the_server_for_every_request(server: str) -> None:
    rows = measure(server, 0.3, sorted(os.sched_getaffinity(0))[:1])
    assert [r.connections for r in rows] == list(CONNECTIONS)
    assert all(r.requests > 0 and r.server == server for r in rows)
    # Each request waits for the previous one's answer: the server has slept in between.
    assert rows[0].wakes_per_request > 0.5
    assert rows[0].cpu_s > 0
