"""The idle benchmark's pure parts: reading /proc's stat lines and turning two readings into
cores per process, and its table."""

from __future__ import annotations

import os

from bench.engine import idle as bench_idle
from bench.harness import proc_cpu


def stat_line(pid: int, name: str, pgrp: int, utime: int, stime: int) -> str:
    fields = ["S", "1", str(pgrp), str(pgrp), "0", "-1", "0", "0", "0", "0", "0"]
    return f"{pid} ({name}) {' '.join(fields)} {utime} {stime} 0 0 20 0 4 0"


def test_a_stat_line_gives_the_group_and_the_cpu_of_every_thread() -> None:
    stat = proc_cpu.parse_stat(7, stat_line(7, "VLLM::Worker (1) x", 5, 300, 45))
    assert (stat.name, stat.pgrp, stat.cpu_ticks) == ("VLLM::Worker (1) x", 5, 345)


def test_cores_are_ticks_over_the_window_per_process_and_in_total() -> None:
    tick = proc_cpu.TICKS_PER_S
    before = {1: proc_cpu.Stat(1, "api", 1, 0), 2: proc_cpu.Stat(2, "worker", 1, 10)}
    after = {
        1: proc_cpu.Stat(1, "api", 1, tick),
        2: proc_cpu.Stat(2, "worker", 1, 10 + 4 * tick),
        3: proc_cpu.Stat(3, "new", 1, 99),  # started inside the window: not counted
    }
    used = proc_cpu.cores_used(before, after, 10.0)
    assert used == {"api": 0.1, "worker": 0.4, "new": 0.0, "total": 0.5}


def test_this_process_group_is_found_in_proc() -> None:
    assert os.getpid() in proc_cpu.group_stats(os.getpgrp())


def test_the_table_has_one_row_per_mode() -> None:
    result = {
        "cpu": {"D": {"api": 0.01, "worker": 0.02, "total": 0.03}, "P": {"total": 0.02}},
        "follow_up_ttft_s": 0.25,
        "follow_up_pulled": 1032,
        "follow_up_prompt": 1160,
        "release_freed_s": 0.08,
    }
    table = bench_idle.format_table({"idle wait on": result, "idle wait off": result})
    assert table.count("\n") == 3
    assert "| idle wait on | 0.030 | api 0.010 / worker 0.020 | 0.020 | 250 ms" in table
