"""What the real node changes on the host, made undoable: a lock, a bridge, rules, cgroups.

A kubelet, containerd and kube-proxy change machine-wide state: the kubelet makes cgroups and
iptables canary chains and sets kernel sysctls, kube-proxy writes NAT rules for every Service,
containerd mounts overlay filesystems and network namespaces. The e2e suite must leave nothing
behind, even after a run that was killed, so `realnode.py` makes every such change through this
module, which records it in a state file *before* making it; `teardown` undoes what the file
lists (and is run again at the next start if a run died half-way).

Network rule of these machines: pods live on a bridge this module creates, on a private /24
that nothing else on the machine routes; ClusterIPs are routed onto that bridge too, so even a
Service packet that no rule rewrote stays inside the machine; a FORWARD guard drops anything a
pod sends beyond its own subnet. One real node per machine: kube-proxy's rules are global.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CGROUP = "/boomerang-node"  # the kubelet's cgroupRoot; every container lives below it
BRIDGE = "bmrg0"
CNI_NETWORK = "boomerang-node"
DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"  # the kubelet's socket here ignores --root-dir
SHIM_SOCKETS = "/run/containerd/s"  # containerd 1.6 puts shims' sockets here, whatever its state
# Fixed paths that the kubelet or libcni create on first use; removed again if we made them.
FIXED_DIRS = (
    DEVICE_PLUGINS,
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/lib/cni/results",
    "/var/lib/cni",
    SHIM_SOCKETS,
    "/run/containerd",
)
GUARD = "BOOMERANG-NODE"  # our FORWARD chain
OWNED_CHAINS = ("KUBE-", "CNI-", GUARD)  # new chains with these prefixes are removed at teardown
SUBNETS = [f"10.233.{i}.0/24" for i in range(64)]
# Sysctls the node (kubelet, CNI bridge, kube-proxy) may change; restored at teardown.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/ipv4/conf/all/route_localnet",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# What must hold for pods to reach each other and Services: routing, and bridged traffic
# seen by iptables (so replies of DNATed Service traffic are un-NATed on the bridge).
NODE_SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}


def run_dir() -> Path:
    """Fixed per machine (the lock, sockets, runtime state): `BOOMERANG_NODE_RUN` overrides."""
    return Path(os.environ.get("BOOMERANG_NODE_RUN", "/run/boomerang-node"))


@dataclass
class HostState:
    """Everything made on the host, written to `state.json` before it is made."""

    path: Path
    subnet: str = ""
    sysctls: dict[str, str] = field(default_factory=dict)  # original values
    chains_before: dict[str, list[str]] = field(default_factory=dict)  # "iptables:nat" -> chains
    pids: dict[str, list[int]] = field(default_factory=dict)  # name -> [pid, start time]
    mount_roots: list[str] = field(default_factory=list)  # unmount everything below these
    delete: list[str] = field(default_factory=list)  # files and directories removed at teardown
    pod_logs: str = ""  # the kubelet's podLogsDir: its links in /var/log/containers go
    containerd_state: str = ""  # names the containers whose shim sockets and CNI results go
    new_dirs: list[str] = field(default_factory=list)  # fixed paths a kubelet creates, if new

    def save(self) -> None:
        data = asdict(self)
        data.pop("path")
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.rename(self.path)

    @classmethod
    def load(cls, path: Path) -> HostState | None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return cls(path, **data)

    @property
    def gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))


class Lock:
    """One real node per machine: an exclusive flock on `<run>/lock`, held while it runs."""

    def __init__(self, run: Path) -> None:
        run.mkdir(parents=True, exist_ok=True)
        self.path = run / "lock"
        self.fd: int | None = None

    def acquire(self, wait: float | None = None) -> None:
        """Wait (`BOOMERANG_NODE_LOCK_WAIT` seconds, 900 by default) while another run has it."""
        if wait is None:
            wait = float(os.environ.get("BOOMERANG_NODE_LOCK_WAIT", "900"))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                    os.close(fd)
                    raise RuntimeError(
                        f"another real node runs on this machine (pid {holder}, lock "
                        f"{self.path}); waited {wait:.0f}s"
                    ) from None
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def sh(*argv: str, check: bool = True, input: str | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


# Processes ----------------------------------------------------------------------------------
def start_time(pid: int) -> int:
    """The process's start time in clock ticks (tells a pid from a later reuse of it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[19])


def kill_recorded(pids: dict[str, list[int]]) -> None:
    for pid, started in pids.values():
        if start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def kill_matching(marker: str) -> None:
    """SIGKILL every process whose command line mentions `marker` (containerd, its shims)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


# Cgroups ------------------------------------------------------------------------------------
def cgroup_mounts() -> list[Path]:
    """Every cgroup hierarchy mounted here (v1 controllers, and the v2 mount of a hybrid)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] in ("cgroup", "cgroup2"):
            mounts.append(Path(left.split()[4]))
    return mounts


def make_cgroup_root() -> None:
    for mount in cgroup_mounts():
        path = mount / CGROUP.lstrip("/")
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset takes no tasks while empty
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((mount / name).read_text())


def cgroup_tree() -> list[Path]:
    """Our cgroup directories in every hierarchy, deepest first."""
    dirs = []
    for mount in cgroup_mounts():
        root = mount / CGROUP.lstrip("/")
        if root.is_dir():
            dirs += [Path(d) for d, _, _ in os.walk(root)]
    return sorted(dirs, key=lambda d: len(d.parts), reverse=True)


def remove_cgroups(timeout: float = 30.0) -> None:
    """Kill every process below our cgroup root, then remove its directories."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for cgroup in cgroup_tree():
            with contextlib.suppress(OSError):
                for pid in (cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                cgroup.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(cgroup)
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"cgroups still busy after {timeout:.0f}s: {left[:3]}")
        time.sleep(0.2)


# Mounts -------------------------------------------------------------------------------------
def unmount_below(roots: list[str]) -> None:
    prefixes = [str(Path(r).resolve()) for r in roots if r]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
            sh("umount", "-l", point, check=False)


# Network ------------------------------------------------------------------------------------
def pick_subnet() -> str:
    """The first candidate /24 that no route or address on this machine overlaps."""
    used = []
    for entry in json.loads(sh("ip", "-j", "-4", "route", "show", "table", "all") or "[]"):
        if entry.get("dst") not in (None, "default"):
            used.append(ipaddress.ip_network(entry["dst"], strict=False))
    for link in json.loads(sh("ip", "-j", "-4", "addr") or "[]"):
        for addr in link.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    for candidate in SUBNETS:
        net = ipaddress.ip_network(candidate)
        if not any(net.overlaps(u) for u in used):
            return candidate
    raise RuntimeError(f"no free pod subnet among {SUBNETS[0]}..{SUBNETS[-1]}")


def make_bridge(state: HostState, service_cidr: str) -> None:
    """The pod bridge with the node's address (its gateway), and the ClusterIP range on it."""
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    prefix = ipaddress.ip_network(state.subnet).prefixlen
    sh("ip", "addr", "add", f"{state.gateway}/{prefix}", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    sh("ip", "route", "add", service_cidr, "dev", BRIDGE, "src", state.gateway)


def delete_bridge() -> None:
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        sh("ip", "link", "del", BRIDGE, check=False)


def add_guard(subnet: str) -> None:
    """Forwarded traffic of pods stays between pods: nothing out of, or into, their subnet."""
    sh("iptables", "-w", "-N", GUARD)
    sh("iptables", "-w", "-A", GUARD, "-s", subnet, "-d", subnet, "-j", "RETURN")
    sh("iptables", "-w", "-A", GUARD, "-s", subnet, "-j", "DROP")
    sh("iptables", "-w", "-A", GUARD, "-d", subnet, "-j", "DROP")
    sh("iptables", "-w", "-I", "FORWARD", "1", "-j", GUARD)


def chains() -> dict[str, list[str]]:
    """Every chain of every table, for IPv4 and IPv6: `{"iptables:nat": [...], ...}`."""
    found: dict[str, list[str]] = {}
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(f"{tool}-save"):
            continue
        table = ""
        for line in sh(f"{tool}-save", check=False).splitlines():
            if line.startswith("*"):
                table = line[1:]
                found.setdefault(f"{tool}:{table}", [])
            elif line.startswith(":"):
                found[f"{tool}:{table}"].append(line[1:].split()[0])
    return found


def foreign_chains(before: dict[str, list[str]]) -> list[str]:
    """Chains named like ours that existed before we started: another kubelet or kube-proxy."""
    return sorted({c for names in before.values() for c in names if c.startswith(OWNED_CHAINS)})


def remove_new_chains(before: dict[str, list[str]]) -> None:
    """Remove chains with our prefixes that were not there before, and every jump to them."""
    for key, names in chains().items():
        tool, table = key.split(":")
        new = {c for c in names if c.startswith(OWNED_CHAINS)} - set(before.get(key, []))
        if not new:
            continue
        for line in sh(f"{tool}-save", "-t", table, check=False).splitlines():
            if line.startswith("-A "):
                args = shlex.split(line)
                if args[1] not in new and "-j" in args and args[args.index("-j") + 1] in new:
                    sh(tool, "-w", "-t", table, "-D", *args[1:], check=False)
        for chain in new:
            sh(tool, "-w", "-t", table, "-F", chain, check=False)
        for chain in new:
            sh(tool, "-w", "-t", table, "-X", chain, check=False)


# Sysctls ------------------------------------------------------------------------------------
def read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    if read_sysctl(name) not in (None, value):
        Path("/proc/sys", name).write_text(value + "\n")


# Teardown -----------------------------------------------------------------------------------
def teardown(state: HostState, marker: str) -> list[str]:
    """Undo everything `state` lists; best effort, returning what could not be undone."""
    problems: list[str] = []

    def step(what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            problems.append(f"{what}: {exc}")

    ids = _container_ids(Path(state.containerd_state)) if state.containerd_state else []
    step("kill daemons", kill_recorded, state.pids)
    step("kill containers", remove_cgroups)
    step("kill containerd and its shims", kill_matching, marker)
    step("unmount", unmount_below, state.mount_roots)
    step("remove cgroups", remove_cgroups)
    step("remove iptables chains", remove_new_chains, state.chains_before)
    step("delete bridge", delete_bridge)
    step("remove log links", _remove_log_links, state.pod_logs)
    step("remove CNI cache", _remove_cni_cache, [i for _, i in ids])
    step("remove shim sockets", _remove_shim_sockets, marker, ids)
    step("remove device-plugin socket", _remove, Path(DEVICE_PLUGINS, "kubelet.sock"))
    for directory in sorted(state.new_dirs, key=len, reverse=True):
        with contextlib.suppress(OSError):
            Path(directory).rmdir()  # only when empty: they did not exist before we started
    for name, value in state.sysctls.items():
        step(f"restore {name}", write_sysctl, name, value)
    for path in state.delete:
        step(f"remove {path}", _remove, Path(path))
    if not problems:
        state.path.unlink(missing_ok=True)
    return problems


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _remove_log_links(pod_logs: str) -> None:
    """The kubelet links each container's log into /var/log/containers (a fixed path)."""
    links = Path("/var/log/containers")
    if not pod_logs or not links.is_dir():
        return
    for link in links.iterdir():
        if link.is_symlink() and os.readlink(link).startswith(pod_logs):
            link.unlink()


def _container_ids(containerd_state: Path) -> list[tuple[str, str]]:
    """(namespace, id) of every task and CRI sandbox containerd's state dir still lists."""
    ids = set()
    for task in containerd_state.glob("io.containerd.runtime.v2.task/*/*"):
        ids.add((task.parent.name, task.name))
    for sandbox in containerd_state.glob("io.containerd.grpc.v1.cri/sandboxes/*"):
        ids.add(("k8s.io", sandbox.name))
    return sorted(ids)


def _remove_shim_sockets(address: str, ids: list[tuple[str, str]]) -> None:
    """A shim's socket is SHIM_SOCKETS/sha256(address/namespace/id); a killed shim leaves it."""
    for namespace, container in ids:
        digest = hashlib.sha256(f"{address}/{namespace}/{container}".encode()).hexdigest()
        Path(SHIM_SOCKETS, digest).unlink(missing_ok=True)


def _remove_cni_cache(ids: list[str]) -> None:
    """libcni caches each attachment's result under /var/lib/cni (a fixed path): ours, and the
    loopback ones of our sandboxes (which a killed run never released)."""
    results = Path("/var/lib/cni/results")
    if results.is_dir():
        for entry in results.iterdir():
            if entry.name.startswith(f"{CNI_NETWORK}-") or any(f"-{i}-" in entry.name for i in ids):
                entry.unlink()
