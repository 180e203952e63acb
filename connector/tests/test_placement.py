"""Each local engine replica gets its own ports and a core that no engine of the other role has."""

from __future__ import annotations

import pytest

from boomerang.local.placement import LocalPorts, PlacementError, plan, role_cores, shared_cores


def counts(prefill: int, decode: int) -> dict:
    return {"prefill": prefill, "decode": decode}


def by_name(replicas) -> dict:
    return {r.name: r for r in replicas}


def test_one_pair_on_two_cores_is_what_it_always_was() -> None:
    replicas = by_name(plan(counts(1, 1), LocalPorts(), [0, 1]))
    p, d = replicas["prefill-0"], replicas["decode-0"]
    assert (p.http_port, p.side_channel_port, p.cpu) == (8100, 5600, 0)
    assert (d.http_port, d.side_channel_port, d.cpu) == (8200, 5700, 1)
    assert p.url == "http://127.0.0.1:8100"


@pytest.mark.parametrize(
    ("prefill", "decode", "cpus"),
    [(2, 1, [0, 1]), (1, 2, [0, 1, 2]), (3, 3, range(4)), (2, 2, range(8)), (4, 1, [2, 5, 7])],
)
def test_every_replica_gets_its_own_ports_and_roles_never_share_a_core(
    prefill, decode, cpus
) -> None:
    replicas = plan(counts(prefill, decode), LocalPorts(), cpus)
    assert [r.name for r in replicas] == [f"prefill-{i}" for i in range(prefill)] + [
        f"decode-{i}" for i in range(decode)
    ]
    ports = [r.http_port for r in replicas] + [r.side_channel_port for r in replicas]
    assert len(set(ports)) == len(ports)
    p_cores = {r.cpu for r in replicas if r.role == "prefill"}
    d_cores = [r.cpu for r in replicas if r.role == "decode"]
    assert p_cores and not p_cores & set(d_cores)
    assert len(set(d_cores)) == decode  # every decoder alone on its core
    assert p_cores | set(d_cores) <= set(cpus)


def test_more_engines_than_cores_share_within_a_role_and_say_so() -> None:
    replicas = plan(counts(2, 1), LocalPorts(), [0, 1])
    placed = [(r.name, r.cpu) for r in replicas]
    assert placed == [("prefill-0", 0), ("prefill-1", 0), ("decode-0", 1)]
    assert shared_cores(replicas) == ["prefill-0, prefill-1 share core 0"]
    assert shared_cores(plan(counts(1, 1), LocalPorts(), [0, 1])) == []


def test_cores_are_split_in_proportion_to_the_replicas() -> None:
    assert role_cores(counts(1, 1), range(4)) == {"prefill": [0, 1], "decode": [2, 3]}
    assert role_cores(counts(3, 1), range(4)) == {"prefill": [0, 1, 2], "decode": [3]}
    assert role_cores(counts(1, 3), range(4)) == {"prefill": [0], "decode": [1, 2, 3]}
    assert role_cores(counts(5, 2), range(4)) == {"prefill": [0, 1], "decode": [2, 3]}
    assert role_cores(counts(9, 1), [4, 6]) == {"prefill": [4], "decode": [6]}
    spread = plan(counts(2, 2), LocalPorts(), range(4))
    assert [r.cpu for r in spread] == [0, 1, 2, 3]


def test_decoders_that_would_share_a_core_are_refused_with_the_reason() -> None:
    with pytest.raises(
        PlacementError,
        match=r"spec.decode.replicas is 2, but the local runtime may use 2 CPU core\(s\) here "
        r"\(\[0, 1\]\): each decode engine needs a core of its own and prefill at least one "
        r"more, so at most 1 decode replica\(s\) fit",
    ):
        plan(counts(1, 2), LocalPorts(), [0, 1])
    with pytest.raises(PlacementError, match=r"may use 1 CPU core\(s\) here \(\[3\]\)"):
        plan(counts(1, 1), LocalPorts(), [3])


def test_counts_whose_ports_collide_are_refused_naming_both() -> None:
    with pytest.raises(
        PlacementError,
        match=r"decode-0's HTTP port would be 8200, already taken by prefill-100 \(HTTP\): more "
        r"replicas than the local runtime's ports leave room for",
    ):
        plan(counts(101, 1), LocalPorts(), [0, 1])
    next_to_router = LocalPorts(router=8101, prefill=8100)
    assert len(plan(counts(1, 1), next_to_router, [0, 1])) == 2
    taken = "prefill-1's HTTP port would be 8101, already taken by the router"
    with pytest.raises(PlacementError, match=taken):
        plan(counts(2, 1), next_to_router, [0, 1])
    with pytest.raises(PlacementError, match="past 65535"):
        plan(counts(3, 1), LocalPorts(prefill=65534), [0, 1])


def test_fewer_than_one_replica_is_refused() -> None:
    with pytest.raises(PlacementError, match=r"spec.decode.replicas must be at least 1, got 0"):
        plan(counts(1, 0), LocalPorts(), [0, 1])
