"""The first-GPU-run probe's decisions, on a stand-in of NIXL's agent (no GPU, no EFA here): it
creates the LIBFABRIC backend, registers the buffer with that backend only, releases it, and
names the fix for each way it can fail."""

from __future__ import annotations

from typing import Any

from boomerang.connector import config
from boomerang.connector.launch.efa_probe import probe


class Agent:
    """NIXL's agent, as far as the probe uses it; `fails` names the call that raises."""

    def __init__(self, fails: str | None = None) -> None:
        self.fails, self.calls = fails, []  # type: list[tuple[str, Any]]

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if name == self.fails:
            raise RuntimeError("NIXL_ERR_BACKEND")

    def create_backend(self, name: str, params: dict[str, str]) -> None:
        self._call("create_backend", name)

    def register_memory(self, regs: list[Any], backends: list[str]) -> str:
        self._call("register_memory", regs, backends)
        return "descs"

    def deregister_memory(self, descs: str, backends: list[str]) -> None:
        self._call("deregister_memory", descs, backends)


def test_a_buffer_registered_with_libfabric_is_released_and_nothing_is_said() -> None:
    agent = Agent()
    assert probe(agent, "gpu-buffer") is None
    assert agent.calls == [
        ("create_backend", ("LIBFABRIC",)),
        ("register_memory", (["gpu-buffer"], ["LIBFABRIC"])),
        ("deregister_memory", ("descs", ["LIBFABRIC"])),
    ]


def test_a_failed_registration_names_the_privileged_fix() -> None:
    said = probe(Agent(fails="register_memory"), "gpu-buffer")
    assert said is not None
    assert said.startswith("NIXL could not register GPU memory with the EFA NIC (RuntimeError")
    assert said.endswith(config.EFA_REGISTRATION_FIX)


def test_no_backend_is_not_mistaken_for_a_registration_failure() -> None:
    said = probe(Agent(fails="create_backend"), "gpu-buffer")
    assert said is not None and said.startswith("NIXL could not create its LIBFABRIC backend")
    assert "spec.efa.privileged" not in said
