"""What the real node costs: start-up time, and CPU and memory of its daemons when idle.

The real node (`realnode.py`) shares a 2-core machine with the control plane, the operator and
the tests, so its own cost is worth knowing before putting engines on it. This starts a control
plane with one fake and one real node and prints a Markdown table (for e2e/README.md):

- start-up: each step of `RealNode.start` (host setup, containerd, image import, kubelet
  registered and Ready, kube-proxy healthy), and how long a first pod takes to become Ready;
- idle cost over `--seconds` (60): CPU (utime + stime from /proc, as % of one core) and RSS
  (sampled every second) of the kubelet, containerd and kube-proxy, first with no pods, then
  with one sleeping pod (which adds its containerd shim; pause and sleep cost nothing).

Usage (root): $VENV/bin/python e2e/bench_node.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster, bin_dir, missing_binaries
from kube import is_true, wait_until
from realnode import RealNode, busybox_pod, missing_prerequisites

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20


def shims(node: RealNode) -> list[int]:
    marker = str(node.socket).encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and marker in cmdline:
            found.append(int(entry.name))
    return found


def measure(node: RealNode, seconds: float) -> dict[str, tuple[float, float, float]]:
    """name -> (CPU % of one core, mean RSS MiB, max RSS MiB) over `seconds`."""
    pids = node.pids()
    pids.update({f"shim {i}": pid for i, pid in enumerate(shims(node))})
    start = {name: cpu_ticks(pid) for name, pid in pids.items()}
    samples: dict[str, list[float]] = {name: [] for name in pids}
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        for name, pid in pids.items():
            samples[name].append(rss_mib(pid))
        time.sleep(1)
    elapsed = time.monotonic() - began
    return {
        name: (
            100 * (cpu_ticks(pid) - start[name]) / TICK / elapsed,
            sum(samples[name]) / len(samples[name]),
            max(samples[name]),
        )
        for name, pid in pids.items()
    }


def table(title: str, rows: dict[str, tuple[float, float, float]]) -> str:
    lines = [
        f"{title}\n",
        "| process | CPU % of one core | RSS mean MiB | RSS max MiB |",
        "|---|---|---|---|",
    ]
    for name, (cpu, mean, peak) in rows.items():
        lines.append(f"| {name} | {cpu:.2f} | {mean:.1f} | {peak:.1f} |")
    cpu = sum(r[0] for r in rows.values())
    lines.append(f"| **total** | {cpu:.2f} | {sum(r[1] for r in rows.values()):.1f} | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    missing = missing_binaries() + missing_prerequisites(bin_dir())
    if missing:
        print(f"missing: {', '.join(missing)}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="boomerang-bench-node-"))
    began = time.monotonic()
    with Cluster(workdir, nodes=1, real_node=True) as cluster:
        node = cluster.node
        assert node is not None
        total = time.monotonic() - began
        print(f"load average before measuring: {os.getloadavg()[0]:.2f}\n")
        steps = " | ".join(f"{k} {v:.2f} s" for k, v in node.timings.items())
        print(f"control plane + real node up in {total:.1f} s; real node: {steps}\n")
        idle = measure(node, args.seconds)
        pod = busybox_pod(node, "idle", "exec sleep 2147483647")
        applied = time.monotonic()
        cluster.apply_objects([pod])
        wait_until(
            "the idle pod Ready",
            lambda: is_true(cluster.get_json("pod", "idle"), "Ready"),
            timeout=180,
            interval=0.1,
        )
        pod_ready = time.monotonic() - applied
        print(f"first pod (apply -> Ready): {pod_ready:.2f} s\n")
        with_pod = measure(node, args.seconds)
    print(table(f"idle, no pods, {args.seconds:.0f} s:", idle) + "\n")
    print(table(f"idle, one sleeping pod, {args.seconds:.0f} s:", with_pod))
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
