"""Where each engine replica of the local runtime listens and which core it runs on.

In a cluster every engine pod has its own IP (so every replica can use the same ports) and the
kubelet gives it its own cores. `boomerang up` runs every replica a manifest asks for on one
machine, so it decides those things itself, here: replica `i` of a role listens on the role's
HTTP and NIXL side-channel base ports plus `i`, and runs on one core.

Cores. vLLM's CPU worker waits for work by spinning on `sched_yield()` for a second after each
engine step, on the core the NixlConnector pinned it to (`boomerang.connector.plugin.cpu_pinning`),
and another engine's runnable worker on that core gets no CPU time meanwhile (0 ticks in 5 s,
measured on a 6.x kernel). A decoder steps continuously for as long as it retains a finished
turn's blocks (`decoderBlocksTTL`, 480 s by default), so:
- a decode engine gets a core of its own: measured with two decoders on one core, the first
  turn sent to the second one hung until the router's 300 s timeout while the first retained
  blocks. `spec.decode.replicas` above the cores left after one for prefill is refused;
- prefill engines never share a decoder's core, but may share cores with each other when there
  are more engines than cores: a prefill engine spins only for the second after its own work,
  so a replica sharing its core waits at most about that long (measured: two prefill engines
  on one core, one decoder on the other, every turn answered as a single engine would).
The cores this process may use are split between the roles in proportion to their replica
counts, the decoders getting at least one each; prefill replicas take theirs in turn, and
`shared_cores` says out loud which share.

Ports that would collide (another replica's, the router's, or past 65535) are refused too.

Everything here is pure: the cores come in as a list (`os.sched_getaffinity(0)` in `up`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from boomerang.facts import engine as names
from boomerang.facts.engine import Role

MAX_PORT = 65535


@dataclass(frozen=True)
class LocalPorts:
    """The ports of the local stack (all on 127.0.0.1): the router's, and each role's base
    ports, to which a replica adds its index."""

    router: int = 8080
    prefill: int = 8100
    decode: int = 8200
    prefill_side_channel: int = names.SIDE_CHANNEL_PORTS["prefill"]
    decode_side_channel: int = names.SIDE_CHANNEL_PORTS["decode"]

    def http(self, role: Role, index: int = 0) -> int:
        return (self.prefill if role == "prefill" else self.decode) + index

    def side_channel(self, role: Role, index: int = 0) -> int:
        base = self.prefill_side_channel if role == "prefill" else self.decode_side_channel
        return base + index


@dataclass(frozen=True)
class Replica:
    """One engine process of the local stack."""

    role: Role
    index: int
    http_port: int
    side_channel_port: int
    cpu: int
    """The core its OpenMP threads are bound to and its NIXL worker thread is pinned to."""

    @property
    def name(self) -> str:
        """As a StatefulSet names its pods: the role, then the ordinal."""
        return f"{self.role}-{self.index}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


class PlacementError(ValueError):
    """The machine cannot run the replicas asked for; the message says why and what would."""


def role_cores(counts: Mapping[Role, int], cpus: Sequence[int]) -> dict[Role, list[int]]:
    """Split the usable cores between the roles, in proportion to their replica counts, with
    one for each decoder and at least one for prefill, and never one in common."""
    cores = sorted(set(cpus))
    prefill, decode = counts["prefill"], counts["decode"]
    if len(cores) < decode + 1:
        raise PlacementError(
            f"spec.decode.replicas is {decode}, but the local runtime may use {len(cores)} "
            f"CPU core(s) here ({cores}): each decode engine needs a core of its own and prefill "
            f"at least one more, so at most {max(len(cores) - 1, 0)} decode replica(s) fit. A "
            f"decoder spins on its core while it retains blocks for the next turn, and an engine "
            f"sharing that core stalls (boomerang.local.placement)"
        )
    share = round(len(cores) * decode / (prefill + decode))
    split = len(cores) - min(max(share, decode), len(cores) - 1)
    return {"prefill": cores[:split], "decode": cores[split:]}


def plan(counts: Mapping[Role, int], ports: LocalPorts, cpus: Sequence[int]) -> list[Replica]:
    """Every replica of both roles with its ports and core, prefill first. Raises
    PlacementError for counts this machine cannot run."""
    for role in names.ROLES:
        if counts[role] < 1:
            raise PlacementError(f"spec.{role}.replicas must be at least 1, got {counts[role]}")
    cores = role_cores(counts, cpus)
    replicas = [
        Replica(
            role=role,
            index=i,
            http_port=ports.http(role, i),
            side_channel_port=ports.side_channel(role, i),
            cpu=cores[role][i % len(cores[role])],
        )
        for role in names.ROLES
        for i in range(counts[role])
    ]
    _check_ports(replicas, ports)
    return replicas


def _check_ports(replicas: Sequence[Replica], ports: LocalPorts) -> None:
    owner: dict[int, str] = {ports.router: "the router"}
    for r in replicas:
        events = r.http_port + names.KV_EVENTS_PORT_OFFSET
        replay = r.http_port + names.KV_REPLAY_PORT_OFFSET
        for kind, port in (
            ("HTTP", r.http_port),
            ("NIXL side-channel", r.side_channel_port),
            ("KV events", events),
            ("KV event replay", replay),
        ):
            what = f"{r.name}'s {kind} port"
            if port > MAX_PORT:
                raise PlacementError(f"{what} would be {port}, past {MAX_PORT}: too many replicas")
            if port in owner:
                raise PlacementError(
                    f"{what} would be {port}, already taken by {owner[port]}: more replicas "
                    f"than the local runtime's ports leave room for (each role's replicas take "
                    f"consecutive ports from its base: HTTP {ports.prefill} and "
                    f"{ports.decode}, NIXL {ports.prefill_side_channel} and "
                    f"{ports.decode_side_channel}, the router {ports.router})"
                )
            owner[port] = f"{r.name} ({kind})"


def shared_cores(replicas: Sequence[Replica]) -> list[str]:
    """One line per core that several replicas share, e.g. `prefill-0, prefill-1 share core 0`."""
    by_core: dict[int, list[str]] = {}
    for r in replicas:
        by_core.setdefault(r.cpu, []).append(r.name)
    return [
        f"{', '.join(names)} share core {cpu}"
        for cpu, names in sorted(by_core.items())
        if len(names) > 1
    ]
