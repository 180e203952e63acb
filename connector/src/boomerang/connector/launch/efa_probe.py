"""Can this container register GPU memory with the EFA NIC? A probe for the first GPU run.

Why: whether NIXL's LIBFABRIC backend can register the KV cache (GPU memory) with the EFA NIC
from an unprivileged container (`IPC_LOCK` only) is the open question behind
`spec.efa.privileged`: public recipes disagree. An engine answers it only after minutes of model
loading, by crashing; this answers it in seconds, in the engine image on an EFA node, the way
vLLM's NIXL connector does it: one NIXL agent, the LIBFABRIC backend, one GPU buffer registered
with it (libfabric's `fi_mr_reg` on every rail), then released.

    kubectl exec <engine pod> -- python3 -m boomerang.connector.launch.efa_probe [--mib 1024]

Exit 0: registration works here, the resource needs no `spec.efa.privileged`. Exit 1: what
failed, and what to try (NIXL's own `fi_mr_reg failed ...` line is above it, on stderr).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from boomerang.connector import config

BACKEND = "LIBFABRIC"


def probe(agent: Any, buffer: Any) -> str | None:
    """Create the LIBFABRIC backend on a NIXL `agent`, register `buffer` (a GPU tensor) with it
    and release it; None when all of it worked, else what failed and what to try."""
    stage = "backend"
    try:
        agent.create_backend(BACKEND, {})
        stage = "register"
        descs = agent.register_memory([buffer], backends=[BACKEND])
        agent.deregister_memory(descs, backends=[BACKEND])
    except Exception as exc:  # NIXL's own error types; the message is the finding
        return advice(exc, stage)
    return None


def advice(error: BaseException, stage: str) -> str:
    """What a failure at `stage` (`backend` or `register`) means, and what to try."""
    what = f"{type(error).__name__}: {error}"
    if stage == "backend":
        return (
            f"NIXL could not create its {BACKEND} backend ({what}): no EFA device in this "
            "container (vpc.amazonaws.com/efa requested?), or libfabric's efa provider failed "
            "(python3 -m boomerang.connector.launch.image_check --require-libfabric-backend says "
            "more)"
        )
    return (
        f"NIXL could not register GPU memory with the EFA NIC ({what}); if NIXL logged "
        f"'fi_mr_reg failed' above: {config.EFA_REGISTRATION_FIX}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="GPU buffer size in MiB")
    parser.add_argument("--device", default="cuda:0", help="the GPU to allocate it on")
    args = parser.parse_args(argv)
    import nixl._api as api
    import torch

    agent = api.nixl_agent(
        "efa-probe", api.nixl_agent_config(enable_prog_thread=False, backends=[])
    )
    buffer = torch.empty(args.mib * 2**20, dtype=torch.uint8, device=args.device)
    failed = probe(agent, buffer)
    if failed is not None:
        print(f"efa_probe: {failed}", file=sys.stderr)
        return 1
    print(f"efa_probe: registered {args.mib} MiB of {args.device} with {BACKEND}: fi_mr_reg works")
    return 0


if __name__ == "__main__":
    sys.exit(main())
